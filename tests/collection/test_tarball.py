"""The collection tarball on its own, as a new user gets it: `ansible-galaxy collection build`, installed into a
fresh venv that holds only ansible-core and its dependencies — no dcu-serving Python package, no checkout, no
ansible.cfg. `dcu.serving.stage` stages a small bundle on a local-connection host (ranges, resume, removal of
what the bundle dropped, idempotence, check mode); `dcu.serving.bundle` says what to install.

ansible-core is installed offline: the wheels of ansible-core and of every distribution it requires are
repacked from the ones installed in the Python running the tests (their RECORD lists every file), into a
wheelhouse that `pip install --no-index --find-links` reads, with pip's configuration ignored
(PIP_CONFIG_FILE=/dev/null). Nothing is downloaded.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from support import REPO, make_bundle

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="staging writes root-owned files (owner: root)")

CHUNK = 1024 * 1024  # dcu_bundle_stage_chunk_mib: 1
CACHE = "/var/cache/dcu-serving/sha256-cache.json"  # bundle_artifact's, for root (as staging runs)
BIG = "images/vllm-sim.tar"


def _requirement_closure(name: str) -> list[metadata.Distribution]:
    """The installed distribution `name` and every one it requires here (markers evaluated, no extras)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _repack(dist: metadata.Distribution, wheelhouse: Path) -> Path:
    """A wheel of an installed distribution: its files as RECORD lists them (scripts outside site-packages are
    left out: pip writes them again from entry_points.txt), with a new RECORD."""
    info = Path(str(dist._path))  # the .dist-info directory
    tags = [line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    prefix = info.name[: -len(".dist-info")]
    wheel = wheelhouse / "{}-{}.whl".format(prefix, "-".join(".".join(p) for p in parts))
    skip = {f"{info.name}/{n}" for n in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for entry in dist.files:
            rel = entry.as_posix()
            if rel.startswith("../") or rel in skip or "__pycache__/" in rel or rel.endswith(".pyc"):
                continue
            data = Path(str(dist.locate_file(entry))).read_bytes()
            zf.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            writer.writerow([rel, f"sha256={digest}", len(data)])
        writer.writerow([f"{info.name}/RECORD", "", ""])
        zf.writestr(f"{info.name}/RECORD", record.getvalue())
    return wheel


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A venv with only ansible-core, the collection installed from its tarball, and a clean environment."""
    root = tmp_path_factory.mktemp("tarball")
    wheelhouse = root / "wheelhouse"
    wheelhouse.mkdir()
    for dist in _requirement_closure("ansible-core"):
        _repack(dist, wheelhouse)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip_env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    pip_env.pop("PIP_FIND_LINKS", None)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-index", "--find-links", str(wheelhouse), "--no-compile",
                    "ansible-core==" + metadata.version("ansible-core")], check=True, env=pip_env)

    home = root / "home"
    home.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "ANSIBLE_COLLECTIONS_PATH": str(root / "collections"), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    # Nothing of the checkout: no dcu_serving to import, and no ansible.cfg (the runs start in `root`).
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import dcu_serving"], env=env,
                           capture_output=True, text=True)
    assert check.returncode != 0 and "No module named 'dcu_serving'" in check.stderr

    def run(*args, check=True):
        proc = subprocess.run(list(args), cwd=root, env=env, capture_output=True, text=True, timeout=600)
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    run("ansible-galaxy", "collection", "build", str(REPO), "--output-path", str(root / "dist"))
    tarball = next((root / "dist").glob("dcu-serving-*.tar.gz"))
    # --no-deps: galaxy.yml's dependencies are not on this offline machine, and neither playbook uses them.
    run("ansible-galaxy", "collection", "install", "--no-deps", "-p", str(root / "collections"), str(tarball))
    installed = root / "collections" / "ansible_collections" / "dcu" / "serving"
    assert (installed / "playbooks" / "stage.yml").is_file() and not (installed / "src").exists()

    class Fresh:
        pass

    f = Fresh()
    f.root, f.run, f.venv, f.env = root, run, venv, env
    return f


def inventory(fresh, name, **settings) -> Path:
    path = fresh.root / f"{name}.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": str(fresh.venv / "bin" / "python")}
    path.write_text(yaml.safe_dump({"all": {"hosts": {"stagehost": host}, "vars": settings}}))
    return path


def playbook(fresh, name, inv, *extra, check=True):
    return fresh.run("ansible-playbook", f"dcu.serving.{name}", "-i", str(inv), *extra, check=check)


def sent(out: str) -> dict[int, str]:
    """{range index: status} of the large file in a `-v` run's output (dcu.serving.bundle_send's result)."""
    for line in out.splitlines():
        if line.startswith(f"changed: [stagehost] => (item={BIG} ("):
            result = json.loads(line[line.index(") => {") + len(") => "):])
            return {r["index"]: r["status"] for r in result["ranges"]}
    raise AssertionError(f"no changed send of {BIG} in:\n{out}")


def recap(out: str) -> dict[str, int]:
    line = re.search(r"^stagehost\s*:(.*)$", out, re.M).group(1)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def staged_files(stage: Path) -> set[str]:
    return {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def staged(fresh):
    """A small bundle (a file and one of three ranges) staged by dcu.serving.stage: --check, run, run again."""
    bundle, stage = fresh.root / "bundle", fresh.root / "stage"
    artifacts = make_bundle(bundle, {"driver/rock-1.0.run": b"#!/bin/sh\n" * 100,
                                     BIG: os.urandom(2 * CHUNK + 12345)})
    inv = inventory(fresh, "stage", dcu_bundle_dir=str(bundle), dcu_bundle_stage_dir=str(stage),
                    dcu_bundle_stage_chunk_mib=1)
    check = playbook(fresh, "stage", inv, "--check", "-v")
    after_check = staged_files(stage) if stage.exists() else set()
    first = playbook(fresh, "stage", inv, "-v")
    cache = json.loads(Path(CACHE).read_text()) if Path(CACHE).exists() else {}
    cached_after_first = {a["file"]: cache.get(os.path.realpath(stage / a["file"]), {}).get("sha256")
                          for a in artifacts}
    again = playbook(fresh, "stage", inv)
    return {"bundle": bundle, "stage": stage, "inv": inv, "artifacts": artifacts, "check": check,
            "after_check": after_check, "first": first, "again": again,
            "cached_after_first": cached_after_first}


def test_stage_needs_nothing_but_the_collection(staged):
    bundle, stage = staged["bundle"], staged["stage"]
    # --check: says what would change, changes nothing on the host
    assert recap(staged["check"].stdout)["changed"] > 0
    assert staged["after_check"] == set()

    assert staged_files(stage) == {a["file"] for a in staged["artifacts"]} | {"index.json", "SHA256SUMS"}
    assert (stage / "index.json").read_bytes() == (bundle / "index.json").read_bytes()
    assert subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=stage,
                          capture_output=True).returncode == 0
    assert sent(staged["check"].stdout) == {0: "to send", 1: "to send", 2: "to send"}
    assert sent(staged["first"].stdout) == {0: "sent", 1: "sent", 2: "sent"}  # the large file went in three ranges
    assert list((stage / ".parts").iterdir()) == [], "no scratch left on the host"
    # each copy was verified on arrival, which cached its sum: the next run reads none of them again
    assert staged["cached_after_first"] == {a["file"]: a["sha256"] for a in staged["artifacts"]}
    assert recap(staged["again"].stdout)["changed"] == 0  # idempotent: nothing travels again


def test_an_interrupted_transfer_resumes_and_dropped_files_go(fresh, staged):
    bundle, stage = staged["bundle"], staged["stage"]
    big = (bundle / BIG).read_bytes()
    sha = hashlib.sha256(big).hexdigest()
    # As an interrupted run leaves the host: the image not complete yet, its first range arrived whole, the
    # second one is recorded with another sum (damaged); plus a file and the scratch of an image the bundle no
    # longer lists.
    (stage / BIG).unlink()
    parts = stage / ".parts" / sha
    parts.mkdir(mode=0o700, parents=True)
    (parts / "data").write_bytes(big[:CHUNK] + b"garbage")
    (parts / f"progress-{CHUNK}").write_text(
        f"0 {hashlib.sha256(big[:CHUNK]).hexdigest()}\n1 {hashlib.sha256(b'garbage').hexdigest()}\n")
    (stage / "driver" / "rock-0.9.run").write_bytes(b"the previous driver")
    (stage / ".parts" / ("0" * 64)).mkdir()
    (stage / ".parts" / ("0" * 64) / "data").write_bytes(b"a dropped image")

    proc = playbook(fresh, "stage", staged["inv"], "-v")
    # the first range is not sent again, the damaged one is replaced
    assert sent(proc.stdout) == {0: "present", 1: "sent", 2: "sent"}
    assert (stage / BIG).read_bytes() == big
    assert staged_files(stage) == {"driver/rock-1.0.run", BIG, "index.json", "SHA256SUMS"}
    assert list((stage / ".parts").iterdir()) == []


def test_stage_refuses_a_bundle_that_does_not_verify(fresh, tmp_path):
    bundle = tmp_path / "bundle"
    make_bundle(bundle, {"driver/rock-1.0.run": b"installer"})
    (bundle / "driver/rock-1.0.run").write_bytes(b"INSTALLER")  # same size, other bytes
    inv = inventory(fresh, "damaged", dcu_bundle_dir=str(bundle), dcu_bundle_stage_dir=str(tmp_path / "stage"))
    proc = playbook(fresh, "stage", inv, check=False)
    assert proc.returncode != 0
    assert "does not verify, 1 problem(s): driver/rock-1.0.run: mismatch" in proc.stdout
    assert "ansible-playbook dcu.serving.bundle" in proc.stdout
    assert not (tmp_path / "stage").exists()


def test_bundle_without_the_package_says_what_to_install(fresh, tmp_path):
    inv = inventory(fresh, "build", dcu_bundle_dir=str(tmp_path / "bundle"),
                    dcu_bundle_manifest={"files": [], "images": []})
    proc = playbook(fresh, "bundle", inv, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "needs the dcu-serving Python package" in out
    assert f"{fresh.venv}/bin/python -m pip install dcu-serving" in out
    assert "--find-links <bundle>/wheels" in out
    assert "No module named 'dcu_serving'" in out
    for unrelated in ("from_json", "JSONDecodeError", "Expecting value", "make bundle"):
        assert unrelated not in out
    assert not (tmp_path / "bundle").exists()


def test_bundle_fails_with_the_builders_own_exit_code_and_message(fresh, tmp_path):
    # A stand-in builder that fails as dcu-bundle does on a bad source; the play shows its words and code.
    stub = tmp_path / "stub" / "dcu_serving" / "bundle"
    stub.mkdir(parents=True)
    for name in ("../__init__.py", "__init__.py", "cli.py"):
        (stub / name).write_text("")
    (stub / "__main__.py").write_text(
        "import sys\nprint('dcu-bundle: rock: source has sha256 00ff, the manifest pins 1234', file=sys.stderr)\n"
        "sys.exit(1)\n")
    inv = inventory(fresh, "build-fails", dcu_bundle_dir=str(tmp_path / "bundle"), dcu_bundle_manifest={"files": []})
    proc = subprocess.run(["ansible-playbook", "dcu.serving.bundle", "-i", str(inv)], cwd=fresh.root,
                          env=dict(fresh.env, PYTHONPATH=str(tmp_path / "stub")), capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "source has sha256 00ff, the manifest pins 1234" in out and re.search(r'"rc": 1\b', out), out
    for unrelated in ("from_json", "JSONDecodeError", "Expecting value"):
        assert unrelated not in out
