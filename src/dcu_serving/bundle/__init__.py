"""The offline bundle: build it on a connected machine, verify it anywhere (docs/bundle.md).

A bundle is a directory with every artifact an air-gapped host needs, described by `index.json`
(format 1: name, kind, version, file, sha256, size, source; images add refs and config_digest) and
`SHA256SUMS` (`sha256sum -c` compatible). `dcu-bundle build` makes one from a manifest,
`dcu-bundle verify` checks one offline and reports every problem. It needs nothing beyond the base
install of dcu-serving (PyYAML).
"""

KINDS = {
    "driver": "driver",
    "dtk": "dtk",
    "hyhal": "hyhal",
    "deb": "debs",
    "image": "images",
    "wheel": "wheels",
    "collection": "collections",
}
"""Artifact kinds and the bundle subdirectory each lives in."""

INDEX = "index.json"
SUMS = "SHA256SUMS"
FORMAT = 1
