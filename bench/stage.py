#!/usr/bin/env python3
"""Staging at size: one large artifact to an emulated node over SSH, our staging beside rsync, in one run.

    .venv/bin/python bench/stage.py [--size-gib 4] [--chunk-mib 512] [--rounds 1] [--node NAME] [--keep]

  ours   playbooks/stage.yml through a real `ansible-playbook` (role dcu_bundle, tasks/stage.yml: the artifact
         sent by dcu.serving.bundle_send in dcu_bundle_stage_chunk_mib ranges, each range hashed on both ends,
         the whole file checked against its SHA-256), from a bundle of one artifact (build/<node>/bundle).
  rsync  `rsync -a` of the same file over SSH into another directory of the same node (rsync checks a
         whole-file checksum of what arrived, too).

Both sides start from a cold destination (the artifact absent on the node, our scratch absent there) and
use the same SSH options: ansible's effective ssh_args (`ansible-config dump`, this repository's ansible.cfg)
plus the inventory's ansible_ssh_common_args, with the same key and user (deploy, sudo; rsync
writes through `sudo rsync` as our staging writes as root). The artifact is random bytes, so SSH compression
(ansible's default ssh_args carry -C) gains nothing on either side. The controller's checksum cache holds the
artifact's sum before either side runs, as it does after `make bundle` (the builder hashes while writing);
the page cache is warm for both sides alike. The range sums dcu.serving.bundle_send remembers on the controller
are removed before each run of ours (it hashes what it sends, as the first time it stages an artifact).
Printed: each side's wall time and MB/s (10^6 bytes/s), the ratio ours/rsync (target >= 0.8), where our run
spends its time (the slowest tasks, json callback), and a second run of ours that must change nothing.

The node: `tools/dcu-node up` with an SSH user on an internal network, as tools/compat-check starts one. The
node image has no rsync (tools/images/node/packages), and the node has no network to install it: the bench
copies the controller's /usr/bin/rsync into the running node (`docker cp` to /usr/local/bin), after checking
that the node has every library it links (the node image and the controller are both Debian bookworm; the
bench stops if one is missing). Adding rsync to the node image recipe would rebuild an image every scenario
shares, for the bench alone. The controller needs rsync (`apt-get install rsync`).

Timing figures are only meaningful on an otherwise quiet machine; both sides share its cores with the node.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from playbook_json import run_json, task_seconds  # noqa: E402 - bench/ is not a package

BIN = Path(sys.executable).parent  # the venv this runs with (ansible-playbook, ansible-config)
ENV = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
           PATH=f"{BIN}:{os.environ.get('PATH', '')}")
NODE = "dcu-bench-stage"  # --node; the network and build/<node>/ (bundle, inventory, key) are named after it
NETWORK = NODE
WORK = REPO / "build" / NODE
USER = "deploy"
STAGE = "/var/lib/dcu-serving/bundle"
RSYNC_DEST = "/var/lib/dcu-serving/rsync"
COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
BLOCK = 8 * 1024 * 1024


def run(argv, check=True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=REPO, **kw)
    if check and done.returncode != 0:
        raise SystemExit(f"{shlex.join(map(str, argv))} failed ({done.returncode}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


def on_node(script: str) -> str:
    return run(["docker", "exec", NODE, "sh", "-ec", script]).stdout


def make_bundle(size: int) -> dict:
    """A format-1 bundle of one artifact of `size` random bytes; kept across runs (same size: reused)."""
    from dcu_serving.bundle.checksum import ChecksumCache, default_cache_path

    bundle = WORK / "bundle"
    rel = f"dtk/bench-{size}.bin"
    path = bundle / rel
    index_path = bundle / "index.json"
    if index_path.exists() and path.exists() and path.stat().st_size == size:
        artifact = json.loads(index_path.read_text())["artifacts"][0]
        if artifact["file"] == rel:
            return artifact
    shutil.rmtree(bundle, ignore_errors=True)
    path.parent.mkdir(parents=True)
    print(f"   writing {size / 2**30:.1f} GiB of random bytes to {path.relative_to(REPO)}", flush=True)
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            block = os.urandom(min(BLOCK, left))
            digest.update(block)
            out.write(block)
            left -= len(block)
    artifact = {"name": "bench", "kind": "dtk", "version": "0", "file": rel, "sha256": digest.hexdigest(),
                "size": size, "source": "bench/stage.py (random bytes)"}
    # As the bundle builder does: the sum of a file hashed while it was written goes into the controller's cache.
    ChecksumCache(default_cache_path()).remember(str(path), artifact["sha256"])
    index_path.write_text(json.dumps({"format": 1, "builder": {"name": "bench/stage.py"},
                                      "artifacts": [artifact]}, indent=1) + "\n")
    (bundle / "SHA256SUMS").write_text(f"{artifact['sha256']}  {rel}\n")
    return artifact


def ansible_ssh_args() -> str:
    """The ssh_args ansible's ssh connection uses with this repository's ansible.cfg."""
    dump = json.loads(run([str(BIN / "ansible-config"), "dump", "-t", "connection", "--format", "json"]).stdout)
    for plugin in dump:
        for option in plugin.get("ssh", []):
            if option["name"] == "ssh_args":
                return option["value"]
    raise SystemExit("ansible-config dump names no ssh_args of the ssh connection")


def start_node(key: Path, chunk_mib: int) -> str:
    run(["tools/dcu-node", "down", NODE])
    run(["tools/dcu-node", "up", NODE, "--cards", "1", "--network", NETWORK, "--ssh-user", USER,
         "--ssh-key", f"{key}.pub"])
    address = run(["tools/dcu-node", "address", NODE]).stdout.strip()
    missing = run(["docker", "run", "--rm", "--entrypoint", "sh", "-v", "/usr/bin/rsync:/rsync:ro",
                   run(["docker", "inspect", "-f", "{{.Config.Image}}", NODE]).stdout.strip(),
                   "-c", "ldd /rsync | grep 'not found' || true"]).stdout.strip()
    if missing:
        raise SystemExit(f"the node image lacks libraries the controller's rsync needs:\n{missing}")
    run(["docker", "cp", "/usr/bin/rsync", f"{NODE}:/usr/local/bin/rsync"])
    on_node("/usr/local/bin/rsync --version >/dev/null")
    inventory = WORK / "inventory"
    inventory.mkdir(parents=True, exist_ok=True)
    (inventory / "hosts.yml").write_text(json.dumps({"all": {
        "hosts": {NODE: {"ansible_host": address, "ansible_user": USER, "ansible_become": True,
                         "ansible_ssh_private_key_file": str(key), "ansible_ssh_common_args": COMMON_ARGS}},
        "vars": {"dcu_bundle_dir": str(WORK / "bundle"), "dcu_bundle_stage_dir": STAGE,
                 "dcu_bundle_stage_chunk_mib": chunk_mib}}}, indent=1) + "\n")
    return address


def cold(artifact: dict) -> None:
    """Neither side's destination on the node, no scratch there, and no range sums remembered on the controller
    (dcu.serving.bundle_send hashes what it sends, as on the first stage of an artifact)."""
    from dcu_serving.bundle.checksum import default_cache_path

    on_node(f"rm -rf {STAGE} {RSYNC_DEST} && mkdir -p {RSYNC_DEST}")
    for sums in (Path(default_cache_path()).parent / "ranges").glob(f"{artifact['sha256']}-*.json"):
        sums.unlink()


def rsync_side(artifact: dict, address: str, ssh: list[str]) -> float:
    cold(artifact)
    src = WORK / "bundle" / artifact["file"]
    started = time.monotonic()
    run(["rsync", "-a", "-e", shlex.join(ssh), "--rsync-path", "sudo /usr/local/bin/rsync",
         str(src), f"{USER}@{address}:{RSYNC_DEST}/"])
    wall = time.monotonic() - started
    size = on_node(f"stat -c %s {RSYNC_DEST}/{src.name}").strip()
    assert int(size) == artifact["size"], f"rsync left {size} bytes, expected {artifact['size']}"
    on_node(f"rm -rf {RSYNC_DEST}")
    return wall


def playbook(*args: str) -> tuple[float, dict, list]:
    """playbooks/stage.yml against the node: wall seconds, the recap counters, [(seconds, task name)]."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(WORK / "inventory"), "playbooks/stage.yml", *args]
    wall, done, report = run_json(argv, ENV, REPO)
    if done.returncode != 0 or report is None:
        raise SystemExit(f"stage.yml failed ({done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-2000:]}")
    tasks = [(task_seconds(task), task["task"]["name"]) for play in report["plays"] for task in play["tasks"]]
    return wall, report["stats"].get(NODE, {}), tasks


def ours_side(artifact: dict) -> tuple[float, list]:
    cold(artifact)
    wall, stats, tasks = playbook()
    assert stats.get("changed", 0) > 0 and not stats.get("failures"), stats
    check = on_node(f"cd {STAGE} && sha256sum --check --strict SHA256SUMS && find . -path './.parts/*' -type f")
    assert check.strip().endswith(": OK"), f"not verified, or chunks left behind:\n{check}"
    return wall, tasks


def main() -> None:
    global NODE, NETWORK, WORK
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=4.0, help="artifact size in GiB (default 4)")
    parser.add_argument("--chunk-mib", type=int, default=512, help="dcu_bundle_stage_chunk_mib (default 512)")
    parser.add_argument("--rounds", type=int, default=1, help="measure each side this many times, alternating")
    parser.add_argument("--node", default=NODE, help=f"the node's container name (default {NODE}), so that two "
                        "benches on one machine do not clash")
    parser.add_argument("--keep", action="store_true", help="leave the node running (tools/dcu-node down "
                        "<node> removes it)")
    args = parser.parse_args()
    NODE = NETWORK = args.node
    WORK = REPO / "build" / NODE
    for tool in ("rsync", "docker", "ssh"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing on the controller (rsync: apt-get install rsync)")
    size = int(args.size_gib * 2**30)

    print(f"Staging at size: {size / 2**30:g} GiB, chunks of {args.chunk_mib} MiB, node {NODE} over SSH")
    WORK.mkdir(parents=True, exist_ok=True)
    artifact = make_bundle(size)
    key = WORK / "operator"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key), "-C", "bench-stage"])
    ssh_args = ansible_ssh_args()
    ssh = ["ssh", *shlex.split(ssh_args), *shlex.split(COMMON_ARGS), "-i", str(key), "-o", "BatchMode=yes"]
    print(f"   ssh options, both sides: {ssh_args} {COMMON_ARGS}")
    try:
        address = start_node(key, args.chunk_mib)
        walls: dict = {"ours": [], "rsync": []}
        tasks: list = []
        for n in range(args.rounds):
            walls["rsync"].append(rsync_side(artifact, address, ssh))
            print(f"   round {n + 1}: rsync {walls['rsync'][-1]:6.1f} s", flush=True)
            wall, tasks = ours_side(artifact)
            walls["ours"].append(wall)
            print(f"   round {n + 1}: ours  {wall:6.1f} s", flush=True)
        rerun, stats, _ = playbook()

        mb = size / 1e6
        best = {side: min(w) for side, w in walls.items()}
        ratio = best["rsync"] / best["ours"]
        print(f"\n  rsync  {best['rsync']:7.1f} s  {mb / best['rsync']:7.1f} MB/s")
        print(f"  ours   {best['ours']:7.1f} s  {mb / best['ours']:7.1f} MB/s   (playbooks/stage.yml, whole run)")
        print(f"  ratio ours/rsync {ratio:.2f}  [{'ok' if ratio >= 0.8 else 'BELOW'}: target >= 0.80]")
        print("  where our last run spent its time:")
        for seconds, name in sorted(tasks, reverse=True)[:6]:
            print(f"    {seconds:6.1f} s  {name}")
        verdict = "ok" if stats.get("changed") == 0 else "FAIL"
        print(f"  second run of ours: {rerun:.1f} s, changed={stats.get('changed')}  [{verdict}: changed must be 0]")
        if verdict != "ok":
            sys.exit(1)
    finally:
        if not args.keep:
            run(["tools/dcu-node", "down", NODE], check=False)
            run(["docker", "network", "rm", NETWORK], check=False)


if __name__ == "__main__":
    main()
