"""The offline bundle: build it on a connected machine, verify it anywhere (docs/bundle.md).

A bundle is a directory with every artifact an air-gapped host needs, described by `index.json`
(format 1: name, kind, version, file, sha256, size, source; images add refs and config_digest) and
`SHA256SUMS` (`sha256sum -c` compatible). `dcu-bundle build` makes one from a manifest,
`dcu-bundle verify` checks one offline and reports every problem. It needs nothing beyond the base
install of dcu-serving (PyYAML). The format is defined, read and verified in one module shared with the
collection's bundle_verify: dcu_serving.bundle.index, a symlink to plugins/module_utils/bundle_index.py.
"""

from dcu_serving.bundle.index import FORMAT, INDEX, KINDS, SUMS

__all__ = ["FORMAT", "INDEX", "KINDS", "SUMS"]
