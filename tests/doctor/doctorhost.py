"""A converged DCU host as dcu-doctor sees it, in a temporary tree: sysfs (tests/modules/sysfs.py), device
nodes owned by the groups Hygon's rules give them, /etc/passwd and /etc/group, the roles' records and env
files, and real executables for hy-smi, systemctl and docker that answer from a state file the test edits.
The vLLM instances and the proxy are real HTTP servers on free ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from modules.sysfs import make_sysfs

SRC = Path(__file__).resolve().parents[2] / "src"
DRIVER = "6.3.30-V1.4.1a"
IMAGE = "harbor.local/dcu/vllm:0.9.2-ubuntu22.04-dtk26.04-py3.10"
IMAGE_ID = "sha256:" + "ab" * 32
RENDER_GID, VIDEO_GID = 1601, 1602  # unlikely to be in use; the tree's /etc/group names them
USERS = ("dcu-serving", "dcu-batch")

# systemctl is-active UNIT...: one word per unit, exit 3 unless all are active (systemd's own behaviour).
SYSTEMCTL = """
state = json.load(open(STATE))
if sys.argv[1:2] != ["is-active"]:
    sys.exit("this stub answers is-active only: " + " ".join(sys.argv[1:]))
words = [state["units"].get(unit.removesuffix(".service"), "inactive") for unit in sys.argv[2:]]
print("\\n".join(words))
sys.exit(0 if all(word == "active" for word in words) else 3)
"""
DOCKER = """
state = json.load(open(STATE))
args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    ref = args[-1]
    if ref in state["images"]:
        labels = state.get("labels", {}).get(ref, {})
        print(json.dumps([{"Id": state["images"][ref], "RepoTags": [ref], "Config": {"Labels": labels}}], indent=4))
        sys.exit(0)
    if ref in state.get("dangling", []) or ref in state["images"].values():  # by ID
        tags = [tag for tag, image_id in state["images"].items() if image_id == ref]
        print(json.dumps([{"Id": ref, "RepoTags": tags, "Config": {"Labels": {}}}], indent=4))
        sys.exit(0)
    print("Error response from daemon: No such image: " + ref, file=sys.stderr)
    sys.exit(1)
if args == ["image", "ls", "--filter", "dangling=true", "--no-trunc", "--quiet"]:
    print("\\n".join(state.get("dangling", [])))
    sys.exit(0)
if args[:1] == ["info"]:
    print(state["docker_root"])
    sys.exit(0)
if args[:1] == ["version"]:
    print(state.get("engine", "20.10.24+dfsg1"))
    sys.exit(0)
sys.exit("this stub does not answer: " + " ".join(args))
"""
HY_SMI = """
state = json.load(open(STATE))
if state["units"].get("hymgr") != "active":
    print("Connect server failed", file=sys.stderr)
    sys.exit(1)
if state.get("hy_smi_hangs"):
    time.sleep(60)
print("=================== System Management Interface ===================")
print("Driver Version: " + state["driver"])
"""


def _executable(path: Path, body: str, state: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport json, sys, time\nSTATE = {str(state)!r}\n{body}")
    path.chmod(0o755)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        status, body = self.server.answer(self.path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server:
    """A loopback HTTP server answering answer(path) -> (status, body bytes), in a thread."""

    def __init__(self, answer):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.answer = answer
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class DoctorHost:
    def __init__(self, root: Path, cards: int = 2):
        self.root = root
        self.cards = cards
        self.state_file = root / "stubs.json"
        self.servers: list[Server] = []
        self.lb_status = None  # set by with_proxy
        self.sysfs = make_sysfs(root / "sys", cards=cards, module=("hycu", DRIVER))
        self.dev, self.etc, self.state, self.proc = root / "dev", root / "etc", root / "state", root / "proc"
        self.log = root / "log"
        self.hyhal, self.dtk, self.run_dir, self.bin = root / "hyhal", root / "dtk", root / "run", root / "bin"
        for directory in (self.dev / "dri", self.dev / "shm", self.etc, self.state, self.proc, self.dtk / ".info",
                          self.run_dir, root / "docker"):
            directory.mkdir(parents=True, exist_ok=True)
        self._nodes()
        (self.etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n" + "".join(
            f"{user}:x:{990 + i}:{990 + i}::/nonexistent:/usr/sbin/nologin\n" for i, user in enumerate(USERS)))
        self.set_members(render=list(USERS), video=list(USERS))
        self.record({"users": list(USERS), "groups": {"compute": "render", "display": "video"},
                     "expected_cards": cards})
        (self.state / "rock-install.json").write_text(json.dumps(
            {"file": f"rock-{DRIVER}.run", "version": DRIVER, "how": "installed by dcu.serving.dcu_driver"}))
        (self.dtk / ".info" / "rocm_version").write_text("26.04\n")
        (self.proc / "meminfo").write_text("MemTotal:       1056797696 kB\nMemFree:        1000000000 kB\n")
        self.stubs = {"units": {"hymgr": "active"}, "images": {}, "docker_root": str(root / "docker"),
                      "driver": DRIVER}
        self.save()
        _executable(self.hyhal / "bin" / "hy-smi", HY_SMI, self.state_file)
        _executable(self.bin / "systemctl", SYSTEMCTL, self.state_file)
        _executable(self.bin / "docker", DOCKER, self.state_file)

    def _nodes(self):
        """kfd and renderD* for group render, card* for video, 0660: what dcu_driver's rules leave."""
        names = [("kfd", RENDER_GID)] + [(f"dri/renderD{128 + i}", RENDER_GID) for i in range(self.cards)]
        names += [(f"dri/card{1 + i}", VIDEO_GID) for i in range(self.cards)]
        for name, gid in names:
            node = self.dev / name
            node.write_text("")
            os.chown(node, 0, gid)
            node.chmod(0o660)

    # --- what a test changes -----------------------------------------------------------------------------

    def set_members(self, render: list, video: list):
        (self.etc / "group").write_text("root:x:0:\n" + "".join(
            f"{user}:x:{990 + i}:\n" for i, user in enumerate(USERS))
            + f"render:x:{RENDER_GID}:{','.join(render)}\nvideo:x:{VIDEO_GID}:{','.join(video)}\n")

    def record(self, data: dict):
        (self.state / "device-access.json").write_text(json.dumps(data))

    def save(self):
        self.state_file.write_text(json.dumps(self.stubs))

    def unit(self, name: str, state: str):
        self.stubs["units"][name] = state
        self.save()

    def with_instances(self, count: int | None = None, image: str = IMAGE, image_id: str = IMAGE_ID,
                       health: int = 200) -> list[Server]:
        """vllm@0..N-1 as dcu_vllm writes them (env files, the unit), each a real server on its port."""
        env_dir = self.etc / "dcu-serving" / "vllm"
        env_dir.mkdir(parents=True, exist_ok=True)
        unit_dir = self.etc / "systemd" / "system"
        unit_dir.mkdir(parents=True, exist_ok=True)
        (unit_dir / "vllm@.service").write_text(
            "[Service]\nExecStart=/usr/bin/docker run --rm --name=vllm-%i --network=host --shm-size=16g "
            "--label=dcu-serving.image=${DCU_VLLM_IMAGE} $DCU_VLLM_RUN_OPTIONS ${DCU_VLLM_IMAGE_ID} \\\n"
            "  vllm serve ${DCU_VLLM_MODEL_DIR} --host 127.0.0.1 --port ${DCU_VLLM_PORT} $DCU_VLLM_SERVE_ARGS\n")
        started = []
        for index in range(self.cards if count is None else count):
            server = Server(lambda path, health=health: (health, b""))
            self.servers.append(server)
            started.append(server)
            (env_dir / f"{index}.env").write_text(
                f"# vllm@{index}: the default layout\nDCU_VLLM_PORT={server.port}\nDCU_VLLM_MODEL=MiniCPM-V-4.5\n"
                f"DCU_VLLM_IMAGE={image}\nDCU_VLLM_IMAGE_ID={image_id}\nDCU_VLLM_SERVE_ARGS=--max-num-seqs 4\n")
            self.stubs["units"][f"vllm@{index}"] = "active"
        self.stubs["units"]["docker"] = "active"
        self.stubs["images"][image] = image_id
        self.save()
        return started

    def with_proxy(self, healthy: int | None = None) -> Server:
        """dcu-proxy's proxy.yml and unit, its /__lb_status from a real server: `healthy` of the instances."""
        ports = sorted(int(line.split("=")[1]) for env in (self.etc / "dcu-serving" / "vllm").glob("*.env")
                       for line in env.read_text().splitlines() if line.startswith("DCU_VLLM_PORT="))
        healthy = len(ports) if healthy is None else healthy
        backends = [{"url": f"http://127.0.0.1:{port}", "healthy": i < healthy, "active": 0,
                     "last_error": None if i < healthy else "connection refused"} for i, port in enumerate(ports)]
        self.lb_status = {"healthy": healthy, "total": len(ports), "queue": 0, "backends": backends}
        proxy = Server(lambda path: (200, json.dumps(self.lb_status).encode()) if path == "/__lb_status"
                       else (404, b"{}"))
        admin = Server(lambda path: (404, b"{}"))
        self.servers += [proxy, admin]
        (self.etc / "dcu-serving" / "proxy.yml").write_text(
            f"# dcu-proxy configuration\nlisten: 0.0.0.0:{proxy.port}\nbackends:\n"
            + "".join(f"- http://127.0.0.1:{port}\n" for port in ports)
            + f"queue_size: 1000\nadmin:\n  listen: 127.0.0.1:{admin.port}\n")
        (self.etc / "systemd" / "system" / "dcu-proxy.service").write_text("[Service]\nExecStart=dcu-proxy\n")
        self.unit("dcu-proxy", "active")
        return proxy

    # --- running the doctor ------------------------------------------------------------------------------

    def argv(self, *options: str) -> list[str]:
        return ["--sysfs-root", str(self.sysfs), "--dev-root", str(self.dev), "--etc-root", str(self.etc),
                "--proc-root", str(self.proc), "--run-root", str(self.run_dir), "--state-root", str(self.state),
                "--hyhal-root", str(self.hyhal), "--dtk-root", str(self.dtk), "--log-root", str(self.log),
                "--min-free-gib", "0.001", *options]

    def env(self) -> dict:
        return {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(SRC)}

    def run(self, *options: str, command: list[str] | None = None, timeout: float = 60):
        """dcu-doctor as a process: (exit status, stdout, stderr)."""
        command = command or [sys.executable, "-m", "dcu_serving.doctor"]
        done = subprocess.run([*command, *self.argv(*options)], capture_output=True, text=True, env=self.env(),
                              timeout=timeout, check=False)
        return done.returncode, done.stdout, done.stderr

    def findings(self, *options: str, command: list[str] | None = None) -> tuple[int, list[dict]]:
        rc, out, err = self.run("--json", *options, command=command)
        assert rc in (0, 1), err
        return rc, json.loads(out)["checks"]

    def close(self):
        for server in self.servers:
            server.close()


def of(findings: list[dict], check: str, status: str | None = None) -> list[dict]:
    return [f for f in findings if f["check"] == check and (status is None or f["status"] == status)]
