"""testinfra checks of a staged bundle (molecule/bundle): the host holds exactly the bundle."""

import json
import os
from pathlib import Path

STAGE = "/var/lib/dcu-serving/bundle"
BUNDLE = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]) / "build" / "bundle"


def test_every_staged_file_matches_its_sum(host):
    check = host.run(f"cd {STAGE} && sha256sum --check --strict SHA256SUMS")
    assert check.rc == 0, check.stdout + check.stderr
    expected = json.loads((BUNDLE / "index.json").read_text())["artifacts"]
    assert check.stdout.count(": OK") == len(expected) > 0


def test_host_index_is_the_controllers(host):
    assert host.file(f"{STAGE}/index.json").content_string == (BUNDLE / "index.json").read_text()


def test_nothing_else_and_no_chunks_left(host):
    staged = set(host.run(f"cd {STAGE} && find . -type f -printf '%P\\n'").stdout.split())
    expected = {a["file"] for a in json.loads((BUNDLE / "index.json").read_text())["artifacts"]}
    assert staged == expected | {"index.json", "SHA256SUMS"}
    assert not host.file(f"{STAGE}/.parts").exists or not host.run(f"ls -A {STAGE}/.parts").stdout.strip()


def test_large_files_went_in_chunks(host):
    # chunk size is 16 MiB in this scenario; the (gzipped) simulator image is larger than that
    sizes = [a["size"] for a in json.loads((BUNDLE / "index.json").read_text())["artifacts"]]
    assert max(sizes) > 16 * 1024 * 1024
