"""The offline bundle end to end from local sources: build, verify, damage, rebuild."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

from dcu_serving.bundle import cli
from dcu_serving.bundle.build import BuildError, expand_platforms
from dcu_serving.bundle.checksum import ChecksumCache
from dcu_serving.bundle.index import verify
from dcu_serving.bundle.manifest import ManifestError, parse
from support import REPO


def index(bundle):
    return json.loads((bundle / "index.json").read_text())


@pytest.mark.docker  # the manifest holds an image from the local engine
def test_build_holds_every_kind_with_sums_and_image_identity(build, manifest, tmp_path, tiny_image):
    build(manifest)
    bundle = tmp_path / "bundle"
    doc = index(bundle)
    assert doc["format"] == 1
    by_kind = {}
    for a in doc["artifacts"]:
        by_kind.setdefault(a["kind"], []).append(a)
        assert (bundle / a["file"]).stat().st_size == a["size"]
    assert [a["file"] for a in by_kind["driver"]] == ["driver/rock-6.3.30-V1.4.1a.run"]
    assert [a["file"] for a in by_kind["dtk"]] == ["dtk/DTK-26.04-Debian12-x86_64.tar.gz"]
    assert [a["name"] for a in by_kind["wheel"]] == ["dcu-serving"]
    assert {a["name"] for a in by_kind["collection"]} == {"dcu.serving", "ansible.posix"}
    [image] = by_kind["image"]
    inspected = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tiny_image],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert image["refs"] == [tiny_image] and image["config_digest"] == inspected
    # saved gzipped (a third of the bytes to stage), still the archive docker load reads
    with tarfile.open(bundle / image["file"], "r:gz") as archive:
        assert "manifest.json" in archive.getnames()
    # SHA256SUMS is what sha256sum -c reads
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=bundle,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(doc["artifacts"])
    assert verify(bundle, ChecksumCache(None))[1] == []


@pytest.mark.docker  # the manifest holds an image from the local engine
def test_verify_reports_every_problem(build, manifest, tmp_path, capsys):
    build(manifest)
    bundle = tmp_path / "bundle"
    corrupt, removed = bundle / "driver/rock-6.3.30-V1.4.1a.run", bundle / "dtk/DTK-26.04-Debian12-x86_64.tar.gz"
    with open(corrupt, "r+b") as f:  # one byte, same size
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    removed.unlink()
    (bundle / "wheels" / "smuggled-1.0-py3-none-any.whl").write_bytes(b"not in the index")

    problems = {(p["problem"], p["file"]) for p in verify(bundle, ChecksumCache(tmp_path / "sha256-cache.json"))[1]}
    assert problems == {
        ("mismatch", "driver/rock-6.3.30-V1.4.1a.run"),
        ("missing", "dtk/DTK-26.04-Debian12-x86_64.tar.gz"),
        ("unlisted", "wheels/smuggled-1.0-py3-none-any.whl"),
    }
    # the command line says the same, and fails
    assert cli.main(["--cache", str(tmp_path / "sha256-cache.json"), "verify", str(bundle)]) == 1
    out = capsys.readouterr().out
    for name in ("rock-6.3.30-V1.4.1a.run", "DTK-26.04-Debian12-x86_64.tar.gz", "smuggled-1.0"):
        assert name in out


@pytest.mark.docker  # the manifest holds an image from the local engine
def test_rebuild_changes_nothing(build, manifest, tmp_path):
    build(manifest)
    bundle = tmp_path / "bundle"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in bundle.rglob("*") if p.is_file()}
    again = build(manifest)
    assert {o.action for o in again.outcomes} == {"kept"}, [(o.file, o.action) for o in again.outcomes]
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in bundle.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.docker  # the manifest holds an image from the local engine
def test_rebuild_repairs_a_damaged_bundle(build, manifest, tmp_path):
    build(manifest)
    bundle = tmp_path / "bundle"
    (bundle / "driver/rock-6.3.30-V1.4.1a.run").write_bytes(b"truncated")
    (bundle / "dtk/DTK-26.04-Debian12-x86_64.tar.gz").unlink()
    again = build(manifest)
    actions = {o.file: o.action for o in again.outcomes}
    assert actions["driver/rock-6.3.30-V1.4.1a.run"] == "fetched"
    assert actions["dtk/DTK-26.04-Debian12-x86_64.tar.gz"] == "fetched"
    assert {a for f, a in actions.items() if not f.startswith(("driver/", "dtk/"))} == {"kept"}
    assert verify(bundle, ChecksumCache(None))[1] == []


def test_a_source_with_another_sum_is_refused(build, local_manifest, tmp_path):
    local_manifest["files"][0]["sha256"] = "0" * 64
    with pytest.raises(BuildError) as err:
        build(local_manifest)
    message = str(err.value)
    assert "driver/rock-6.3.30-V1.4.1a.run" in message and "0" * 64 in message
    assert not (tmp_path / "bundle" / "driver" / "rock-6.3.30-V1.4.1a.run").exists()
    assert not (tmp_path / "bundle" / "index.json").exists()


def test_manifest_mistakes_are_all_named():
    with pytest.raises(ManifestError) as err:
        parse({"dcu_bundle_manifest": {
            "files": [{"name": "rock", "kind": "driver", "version": "1", "src": "/x/rock.run"},
                      {"name": "f", "kind": "firmware", "version": "1", "src": "/x/f", "sha256": "a" * 64}],
            "images": [{"name": "vllm", "ref": "registry/vllm:latest"}, {"name": "x", "ref": "registry/x"}],
        }})
    errors = "\n".join(err.value.errors)
    assert "dcu_bundle_manifest.files[0].sha256: missing" in errors
    assert "dcu_bundle_manifest.files[1].kind: 'firmware'" in errors
    assert "dcu_bundle_manifest.images[0].ref" in errors and "floating" in errors
    assert "dcu_bundle_manifest.images[1].ref" in errors and "no tag" in errors
    assert len(err.value.errors) == 4


def test_a_manifest_file_outside_its_kinds_directory_is_refused():
    """The bundle file a manifest names is where the build writes and a host stages: never outside the bundle."""
    with pytest.raises(ManifestError) as err:
        parse({"dcu_bundle_manifest": {"files": [
            {"name": "rock", "kind": "driver", "version": "1", "src": "/x/rock.run", "sha256": "a" * 64,
             "file": "../../root/.ssh/authorized_keys"},
            {"name": "dtk", "kind": "dtk", "version": "1", "src": "/x/dtk.tar.gz", "sha256": "b" * 64,
             "file": "/etc/profile.d/dtk.sh"},
            {"name": "up", "kind": "dtk", "version": "1", "src": "http://mirror/dtk/..", "sha256": "c" * 64}]}})
    errors = err.value.errors
    assert errors == [
        "dcu_bundle_manifest.files[0].file: '../../root/.ssh/authorized_keys' is not a plain path (an empty, . or .. "
        "part)",
        "dcu_bundle_manifest.files[1].file: '/etc/profile.d/dtk.sh' is an absolute path; give it relative to the "
        "bundle (dtk/<name>)",
        "dcu_bundle_manifest.files[2].file: 'dtk/..' is not a plain path (an empty, . or .. part)"]


def test_a_debian_package_from_the_archive_lands_in_debs_under_its_own_name():
    """Debian's pool quotes a version's '+' and '~' in its URLs; the bundle keeps the package's real name."""
    m = parse({"dcu_bundle_manifest": {"files": [{
        "name": "prometheus", "kind": "deb", "version": "2.42.0+ds-5+deb12u1", "sha256": "a" * 64,
        "src": "http://deb.debian.org/debian/pool/main/p/prometheus/prometheus_2.42.0%2bds-5%2bdeb12u1_amd64.deb"}]}})
    assert m.files[0].file == "debs/prometheus_2.42.0+ds-5+deb12u1_amd64.deb"


def test_collections_install_offline_from_the_bundle(build, local_manifest, tmp_path):
    build(local_manifest)
    tarballs = sorted(str(p) for p in (tmp_path / "bundle" / "collections").glob("*.tar.gz"))
    galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    done = subprocess.run([galaxy, "collection", "install", "--offline", "--force", "-p", str(tmp_path / "c"),
                           *tarballs], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "c/ansible_collections/ansible/posix/MANIFEST.json").is_file()
    assert (tmp_path / "c/ansible_collections/dcu/serving/MANIFEST.json").is_file()


def tiny_wheel(directory) -> tuple[str, str]:
    """A minimal wheel, tiny-1.0, in `directory`; returns (file name, sha256)."""
    import hashlib
    import zipfile
    name = "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(directory / name, "w") as whl:
        whl.writestr("tiny.py", "")
        whl.writestr("tiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
        whl.writestr("tiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        whl.writestr("tiny-1.0.dist-info/RECORD", "")
    return name, hashlib.sha256((directory / name).read_bytes()).hexdigest()


def test_a_hashed_requirements_file_brings_its_wheels_and_refuses_another_sum(build, local_manifest, tmp_path,
                                                                              monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    name, digest = tiny_wheel(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the index here is a directory: no registry is asked
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    pinned = tmp_path / "gateway.txt"
    pinned.write_text(f"tiny==1.0 --hash=sha256:{digest}\n")
    local_manifest["wheels"]["hashed"] = [str(pinned)]
    build(local_manifest)
    entries = {a["file"]: a for a in index_of(tmp_path / "bundle") if a["kind"] == "wheel"}
    wheels = {file: a["sha256"] for file, a in entries.items()}
    assert wheels[f"wheels/{name}"] == digest
    assert any(f.startswith("wheels/dcu_serving-") for f in wheels)  # the unhashed requirements still come
    # Each wheel's Requires-Python, for dcu_proxy's choice of runtime without reading the wheel ("" when none).
    ours = next(a for f, a in entries.items() if f.startswith("wheels/dcu_serving-"))
    assert (ours["requires_python"], entries[f"wheels/{name}"]["requires_python"]) == (">=3.11", "")

    pinned.write_text(f"tiny==1.0 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(BuildError) as err:
        build(local_manifest, tmp_path / "other")
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in str(err.value)

    local_manifest["wheels"]["hashed"] = [str(tmp_path / "missing.txt")]
    with pytest.raises(ManifestError) as bad:
        build(local_manifest, tmp_path / "third")
    assert "dcu_bundle_manifest.wheels.hashed[0]" in str(bad.value) and "pip-compile" in str(bad.value)


def index_of(bundle) -> list[dict]:
    return index(bundle)["artifacts"]


def test_manylinux_request_covers_older_glibc_wheels():
    tags = expand_platforms(["manylinux_2_36_x86_64"])
    for tag in ("manylinux_2_36_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"):
        assert tag in tags
    assert "manylinux_2_37_x86_64" not in tags


def test_demo_manifest_pins_what_the_vendor_builder_makes(tmp_path):
    """The demo's pinned vendor sums match a fresh build: a stale pin would fail `make bundle` on a clean clone."""
    out = subprocess.run([sys.executable, str(REPO / "tools" / "build-vendor-artifacts"), "--out", str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout
    built = {line.split()[1].rsplit("/", 1)[-1]: line.split()[0] for line in out.splitlines() if line.strip()}
    demo = yaml.safe_load((REPO / "inventories/demo/group_vars/all/bundle.yml").read_text())
    pinned = {f["src"].rsplit("/", 1)[-1]: f["sha256"] for f in demo["dcu_bundle_manifest"]["files"]
              if f["kind"] != "deb"}  # the Debian packages are the archive's, pinned to its sums
    assert pinned == {name: built.get(name) for name in pinned}
