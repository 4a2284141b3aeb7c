# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Read what an image tarball holds without loading it.

Understands `docker save` / `podman save` archives (manifest.json with Config and RepoTags) and OCI
image layouts (index.json -> manifest blob -> config digest), plain or gzip-compressed. Only the
small JSON members are read; layer data is skipped (seeked over in an uncompressed tar).
"""

import contextlib
import json
import tarfile

from ansible_collections.dcu.serving.plugins.module_utils.checksum import update_json_store


class ArchiveError(Exception):
    pass


def _digest_from_config_path(path):
    # "3f0e...e2.json" (docker save) or "blobs/sha256/3f0e...e2" (docker 25+ / OCI)
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".json"):
        name = name[:-5]
    if len(name) != 64:
        raise ArchiveError("unexpected config path %r in manifest.json" % path)
    return "sha256:" + name


def _read_members(path, wanted):
    """The contents of the members whose names satisfy wanted(name), in one pass over the archive."""
    found = {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                if member.isfile() and wanted(member.name):
                    handle = archive.extractfile(member)
                    found[member.name.lstrip("./")] = handle.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError("%s is not a readable image archive: %s" % (path, exc)) from exc
    return found


def _json(blob, what):
    try:
        return json.loads(blob.decode("utf-8"))
    except ValueError as exc:
        raise ArchiveError("%s is not valid JSON: %s" % (what, exc)) from exc


def read_images(path):
    """[{"refs": [...], "config_digest": "sha256:..."}] for every image in the archive."""
    small = _read_members(path, lambda n: n.lstrip("./") in ("manifest.json", "index.json"))
    if "manifest.json" in small:
        manifest = _json(small["manifest.json"], "manifest.json")
        if not isinstance(manifest, list):
            raise ArchiveError("manifest.json in %s is not a list of images" % path)
        return [{"refs": list(entry.get("RepoTags") or []),
                 "config_digest": _digest_from_config_path(entry["Config"])} for entry in manifest]
    if "index.json" not in small:
        raise ArchiveError("%s has neither manifest.json (docker save) nor index.json (OCI layout)" % path)
    index = _json(small["index.json"], "index.json")
    manifests = index.get("manifests") or []
    blob_names = set("blobs/%s" % m["digest"].replace(":", "/") for m in manifests)
    blobs = _read_members(path, lambda n: n.lstrip("./") in blob_names)
    images = []
    for m in manifests:
        blob = blobs.get("blobs/%s" % m["digest"].replace(":", "/"))
        if blob is None:
            raise ArchiveError("index.json in %s names %s, which the archive lacks" % (path, m["digest"]))
        config = (_json(blob, m["digest"]).get("config") or {}).get("digest")
        annotations = m.get("annotations") or {}
        ref = annotations.get("io.containerd.image.name") or annotations.get("org.opencontainers.image.ref.name")
        images.append({"refs": [ref] if ref and ":" in ref else [], "config_digest": config})
    return images


def cached_images(path, sha256, store, write=True):
    """(read_images(path), from_store), remembered in the JSON file `store` by the archive's SHA-256.

    The caller has verified that path holds exactly these bytes, so what it holds is known without reading it
    again: a gzipped docker save archive keeps manifest.json at its end, and reading it means decompressing
    the whole image (seconds for a small one, minutes for a large one) on every run. Keyed by content, an
    entry is never stale. `store=None` reads the archive.
    """
    if store:
        try:
            with open(store) as handle:
                known = json.load(handle).get(sha256)
        except (OSError, ValueError, AttributeError):
            known = None
        if isinstance(known, list):
            return known, True
    images = read_images(path)
    if store and write:
        _remember(store, sha256, images)
    return images, False


def _remember(store, sha256, images):
    with contextlib.suppress(OSError):  # not writable: the next run reads the archive again
        update_json_store(store, lambda data: dict(data, **{sha256: images}), ".image-archives.")
