#!/usr/bin/env python3
"""What a re-run costs on a converged node, and how fast a cold start reaches 8/8. Three measures:

  1  site.yml a second time on the converged node: wall time, and changed must be 0; beside it the tasks that
     ran and the module calls that reached the host. With --baseline REF, the same playbook of another commit
     (`git archive REF`, its own collection) runs in turn with this tree's on the same node, --rounds times
     each, so before and after are measured side by side in one run (target: <= 20 s).
  2  the dcu_images role (every task: the staged file's check and the load) when the engine already
     holds a 2 GB image: with the checksum cache (target < 2 s) and, side by side, with the cache
     removed (the tarball's SHA-256 read in full).
  3  `systemctl start` of every vllm@N at once: until the units are up (ExecStartPost saw each one
     serve) and until dcu.serving.cluster_health sees N/N through the proxy.

Runs against a node provisioned by `make demo` (default) or any inventory host that is a Docker
container (--container names it; the 2 GB tarball is copied in with `docker cp`):

    make demo && .venv/bin/python bench/converge.py [--image-gb 2] [--skip-image] [--baseline REF --rounds 2]

Timing figures are only meaningful on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from playbook_json import run_json  # noqa: E402 - bench/ is not a package
from playbook_json import task_seconds as task_duration  # noqa: E402

BIN = Path(sys.executable).parent  # the venv this runs in (.venv/bin/python bench/converge.py)
ENV = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
STAGE = "/var/lib/dcu-serving/bench-bundle"
CACHE = "/var/cache/dcu-serving/sha256-cache.json"


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=REPO, **kw)


def node(container: str, *cmd: str) -> str:
    done = run(["docker", "exec", container, *cmd])
    if done.returncode != 0:
        raise SystemExit(f"docker exec {container} {' '.join(cmd)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


# Actions that run on the controller only: no module call reaches the host.
CONTROLLER_ACTIONS = {"set_fact", "assert", "debug", "include_tasks", "include_role", "import_tasks", "include_vars",
                      "validate_argument_spec", "fail", "meta", "gather_facts_skipped"}
# Actions whose plugin calls two modules on the host when nothing changes (stat for the sum, then file).
TWO_CALLS = {"template", "copy"}


def module_calls(result: dict) -> int:
    """Module calls one task sent to the host (loop items each count; skipped ones do not)."""
    action = result.get("action", "").rsplit(".", 1)[-1]
    if action in CONTROLLER_ACTIONS:
        return 0
    items = [r for r in result.get("results", [result]) if not r.get("skipped")]
    return len(items) * (2 if action in TWO_CALLS else 1)


def site_once(args, tree: Path) -> dict:
    """site.yml of `tree` against the host, timed: wall seconds, the recap and the module calls to the host."""
    inventory = str(Path(args.inventory).resolve())
    wall, done, report = run_json([str(BIN / "ansible-playbook"), "-i", inventory, "playbooks/site.yml",
                                   "-l", args.host], dict(ENV, ANSIBLE_CONFIG=str(tree / "ansible.cfg")), tree)
    if report is None:
        raise SystemExit(f"site.yml of {tree} printed no JSON (exit {done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    stats = report["stats"].get(args.host, {})
    tasks = calls = 0
    for play in report["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(args.host)
            if result is None:
                continue
            tasks += 1
            calls += module_calls(result)
    return {"wall": wall, "rc": done.returncode, "ok": stats.get("ok"), "changed": stats.get("changed"),
            "skipped": stats.get("skipped"), "failed": stats.get("failures"), "tasks": tasks, "calls": calls}


def baseline_tree(ref: str, dest: Path) -> Path:
    """`git archive REF` unpacked, with its collection linked the way `make venv` links the checkout's."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref], capture_output=True, cwd=REPO)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {ref}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    (dest / "build").symlink_to(REPO / "build")  # the bundle and vendor files the inventory points at
    link = dest / ".collections" / "ansible_collections" / "dcu"
    link.mkdir(parents=True)
    (link / "serving").symlink_to("../../..")
    return dest


def site_rerun(args) -> None:
    print("1  site.yml on the converged node")
    argv = [str(BIN / "ansible-playbook"), "-i", args.inventory, "playbooks/site.yml", "-l", args.host]
    first = run(argv)
    if first.returncode != 0:
        raise SystemExit(f"site.yml failed on {args.host}; converge it first (make demo):\n{first.stdout[-3000:]}")
    with tempfile.TemporaryDirectory(prefix="dcu-bench-baseline.") as tmp:
        trees = [("this tree", REPO)]
        if args.baseline:
            commit = run(["git", "rev-parse", "--short", args.baseline]).stdout.strip()
            trees.insert(0, (f"baseline {args.baseline} ({commit})", baseline_tree(args.baseline, Path(tmp))))
        runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
        for round_ in range(args.rounds):
            for name, tree in trees:  # in turn, so both see the same machine
                result = site_once(args, tree)
                runs[name].append(result)
                verdict = "ok" if result["rc"] == 0 and result["changed"] == 0 else "FAIL: changed must be 0"
                print(f"   round {round_ + 1}  {name:32} {result['wall']:6.1f} s wall  tasks {result['tasks']:3}"
                      f" (ok={result['ok']} changed={result['changed']} skipped={result['skipped']})"
                      f"  module calls to the host {result['calls']:3}  [{verdict}]", flush=True)
        print("   median of the rounds:")
        best = {}
        for name, _ in trees:
            walls = sorted(r["wall"] for r in runs[name])
            best[name] = walls[len(walls) // 2]
            last = runs[name][-1]
            print(f"     {name:32} {best[name]:6.1f} s  tasks {last['tasks']:3}  module calls {last['calls']:3}"
                  f"  [{'ok' if best[name] <= 20 else 'over'}: target <= 20 s]")
        if args.baseline:
            (base, _), (this, _) = trees
            print(f"   this tree / baseline: {best[this] / best[base]:.2f}x the time, "
                  f"{runs[this][-1]['calls']} / {runs[base][-1]['calls']} module calls")


def image_task_seconds(args, playbook: Path) -> tuple[float, float, dict]:
    """Durations of the load task and of the whole dcu_images role (json callback), and the load's result."""
    _, done, report = run_json([str(BIN / "ansible-playbook"), "-i", args.inventory, str(playbook), "-l", args.host],
                               ENV, REPO)
    if done.returncode != 0 or report is None:
        raise SystemExit(f"the image play failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    role, task_seconds, load = 0.0, 0.0, None
    for play in report["plays"]:
        for task in play["tasks"]:
            seconds = task_duration(task)
            role += seconds
            if task["task"]["name"].endswith("Load the images the engine lacks"):
                task_seconds, load = seconds, task["hosts"][args.host]
    if load is None:
        raise SystemExit("no 'Load the images the engine lacks' task in the play's output")
    return task_seconds, role, load


def image_cache(args) -> None:
    size = int(args.image_gb * 1024**3)
    print(f"2  dcu_images with a {size / 1024**3:.1f} GiB image already loaded")
    ref = f"dcu-bench/big:{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="dcu-bench.", dir=REPO / "build") as tmp:
        tmp = Path(tmp)
        # A one-layer image of incompressible bytes, saved the way the bundle saves images.
        importer = subprocess.Popen(["docker", "import", "-", ref], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        with tarfile.open(fileobj=importer.stdin, mode="w|") as layer, open("/dev/urandom", "rb") as noise:
            blob = tarfile.TarInfo("blob")
            blob.size = size
            layer.addfile(blob, noise)
        importer.stdin.close()
        if importer.wait() != 0:
            raise SystemExit("docker import of the bench image failed")
        archive = tmp / "big.tar"
        subprocess.run(["docker", "save", "-o", str(archive), ref], check=True)
        subprocess.run(["docker", "rmi", ref], check=True, capture_output=True)
        digest = run(["sha256sum", str(archive)]).stdout.split()[0]
        config = json.loads(run(["tar", "-xOf", str(archive), "manifest.json"]).stdout)[0]["Config"]
        index = {"format": 1, "artifacts": [{"name": "big", "kind": "image", "version": "1", "file": "images/big.tar",
                                             "sha256": digest, "size": archive.stat().st_size, "refs": [ref],
                                             "config_digest": "sha256:" + Path(config).name.removesuffix(".json")}]}
        (tmp / "index.json").write_text(json.dumps(index))
        node(args.container, "mkdir", "-p", f"{STAGE}/images")
        for src, dest in ((archive, f"{STAGE}/images/big.tar"), (tmp / "index.json", f"{STAGE}/index.json")):
            subprocess.run(["docker", "cp", str(src), f"{args.container}:{dest}"], check=True)
        playbook = tmp / "images.yml"
        playbook.write_text(json.dumps([{
            "name": "Load the bench image", "hosts": args.host, "gather_facts": False, "become": True,
            "roles": [{"role": "dcu.serving.dcu_images",
                       "vars": {"dcu_images_bundle_dir": STAGE, "dcu_images_bundle_source": "host"}}]}]))
        try:
            cold, cold_role, result = image_task_seconds(args, playbook)
            loaded = result["results"][0]["loaded"]
            print(f"   first run (loads it):          load task {cold:6.2f} s, whole role {cold_role:6.2f} s  "
                  f"loaded {loaded}")
            warm, warm_role, result = image_task_seconds(args, playbook)
            cached = result["results"][0]["checksum"]["cached"]
            node(args.container, "rm", "-f", CACHE)
            _, uncached_role, _ = image_task_seconds(args, playbook)
            print(f"   already loaded, cache warm:    load task {warm:6.2f} s, whole role {warm_role:6.2f} s  "
                  f"(sum from cache: {cached}, changed: {result['changed']})  "
                  f"[{'ok' if warm < 2 else 'FAIL'}: load task < 2 s]")
            print(f"   already loaded, cache absent:  whole role {uncached_role:6.2f} s  (the tarball read in full: "
                  f"+{uncached_role - warm_role:.2f} s)")
        finally:
            run(["docker", "exec", args.container, "docker", "rmi", "--force", ref])
            run(["docker", "exec", args.container, "rm", "-rf", STAGE])


def cold_start(args) -> None:
    units = [u for u in node(args.container, "systemctl", "list-units", "--plain", "--no-legend", "vllm@*").split("\n")
             if u]
    names = sorted((u.split()[0] for u in units), key=lambda n: int(n.split("@")[1].split(".")[0]))
    print(f"3  systemctl start of {len(names)} vllm units until cluster_health sees {len(names)}/{len(names)}")
    node(args.container, "systemctl", "stop", *names)
    # The proxy must have seen them down, or it would report the old 8/8 at once.
    deadline = time.monotonic() + 60
    while True:
        status = json.loads(node(args.container, "python3", "-c", "import urllib.request;print(urllib.request."
                                 "urlopen('http://127.0.0.1:8000/__lb_status').read().decode())"))
        if status["healthy"] == 0:
            break
        if time.monotonic() > deadline:
            raise SystemExit("the proxy still reports healthy backends 60 s after stopping every unit")
        time.sleep(0.2)
    started = time.monotonic()
    health = subprocess.Popen([str(BIN / "ansible"), args.host, "-i", args.inventory, "--become", "-m",
                               "dcu.serving.cluster_health", "-a",
                               f"expected={len(names)} interval=0.2 timeout=600"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
    node(args.container, "systemctl", "start", *names)
    units_up = time.monotonic() - started
    out, _ = health.communicate()
    seen = time.monotonic() - started
    verdict = "ok" if health.returncode == 0 else "FAIL"
    print(f"   units up (every ExecStartPost saw its instance serve): {units_up:6.1f} s")
    print(f"   cluster_health sees {len(names)}/{len(names)} through the proxy:      {seen:6.1f} s  [{verdict}]"
          f"  (includes the module's start-up and up to one proxy health interval)")
    if health.returncode != 0:
        print(out[-2000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", default="inventories/demo/hosts.yml")
    parser.add_argument("--host", default="dcu-demo", help="inventory host")
    parser.add_argument("--container", default="dcu-demo", help="the host's Docker container")
    parser.add_argument("--image-gb", type=float, default=2.0)
    parser.add_argument("--baseline", metavar="REF", help="also run site.yml of this commit, in turn (before/after)")
    parser.add_argument("--rounds", type=int, default=1, help="no-op runs of each tree (the median is compared)")
    for part in ("site", "image", "start"):
        parser.add_argument(f"--skip-{part}", action="store_true")
    args = parser.parse_args()
    if run(["docker", "container", "inspect", args.container]).returncode != 0:
        raise SystemExit(f"no container {args.container}: run `make demo` first "
                         "(or give --inventory, --host and --container)")
    if not args.skip_site:
        site_rerun(args)
    if not args.skip_image:
        image_cache(args)
    if not args.skip_start:
        cold_start(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
