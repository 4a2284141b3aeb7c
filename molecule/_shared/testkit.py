"""What the scenarios' testinfra checks share: playbooks run as an operator runs them, the recap they
print, and dcu.serving modules run on a node. Imported by each scenario's tests/conftest.py, which also
imports the fixtures at the end (`recap`, `dcu_module`) to offer them to its tests."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import zipfile
from pathlib import Path

import pytest

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[2]))


def _playbook(playbook: str, args, extra_vars: dict | None, env: dict | None, inventory: Path | None = None):
    inventory = inventory or Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    argv = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(inventory),
            str(PROJECT / "playbooks" / playbook), *args]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               **(env or {}))
    return argv, env


def run_playbook(playbook: str, *args: str, extra_vars: dict | None = None, timeout: int = 900,
                 env: dict | None = None, inventory: Path | None = None):
    """ansible-playbook playbooks/<playbook> against the scenario's inventory (or another one); returns (rc, output).
    env adds to the environment (ANSIBLE_STDOUT_CALLBACK=ansible.posix.json: the output is JSON)."""
    argv, env = _playbook(playbook, args, extra_vars, env, inventory)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=PROJECT)
    return proc.returncode, proc.stdout + proc.stderr


def reboot(host_name: str, timeout: int = 600) -> tuple[int, str]:
    """Reboot a node as an operator reboots a host - ansible.builtin.reboot over the scenario's own connection - and
    wait until its systemd has finished booting (every enabled unit started or failed). Returns (rc, output)."""
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    args = {"reboot_command": "systemctl reboot", "boot_time_command": "cut -d' ' -f22 /proc/1/stat",
            "test_command": "systemctl is-system-running | grep -qxE 'running|degraded'",
            "reboot_timeout": timeout - 30}
    argv = [shutil.which("ansible") or "ansible", "-i", str(inventory), host_name, "-b", "-m",
            "ansible.builtin.reboot", "-a", json.dumps(args)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=PROJECT)
    return proc.returncode, proc.stdout + proc.stderr


def start_playbook(playbook: str, *args: str, extra_vars: dict | None = None, env: dict | None = None):
    """run_playbook without waiting: the Popen of ansible-playbook in its own session (interrupt it with
    kill_playbook); its output is discarded."""
    argv, env = _playbook(playbook, args, extra_vars, env)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=PROJECT,
                            start_new_session=True)


def _descendants(pid: int) -> list[int]:
    children: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_playbook(proc) -> None:
    """SIGKILL a running ansible-playbook and everything it started. Its process group is not enough: each
    worker (one task on one host, a whole loop included) calls setsid, and would go on copying after its parent
    died. The playbook is stopped first so that it starts no worker while they are collected."""
    os.kill(proc.pid, signal.SIGSTOP)
    groups = {proc.pid}
    for pid in _descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            groups.add(os.getpgid(pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    proc.wait()


def recap(output: str, host: str) -> dict:
    """{'ok': N, 'changed': N, 'failed': N, ...} from the PLAY RECAP lines of `host`, summed over plays."""
    total: dict = {}
    for line in output.splitlines():
        if line.startswith(host + " ") and "ok=" in line:
            for field in line.split(":", 1)[1].split():
                key, value = field.split("=")
                total[key] = total.get(key, 0) + int(value)
    if not total:
        raise AssertionError(f"no PLAY RECAP line for {host} in:\n{output[-3000:]}")
    return total


def module(host, name: str, **args) -> dict:
    """Run a dcu.serving module on the node through Ansible (testinfra); a failure is returned, not raised.

    The result file of `ansible --tree` may lack the "failed" key, so tests assert on what the module
    reports (msg, problems), not on that flag.
    """
    try:
        return host.ansible(name, " ".join(f"{k}={v}" for k, v in args.items()), check=False, become=True)
    except host.ansible.AnsibleException as exc:
        return exc.result


@pytest.fixture(name="recap", scope="session")
def recap_fixture():
    """recap(output, "node") -> the PLAY RECAP counters of that host."""
    return recap


@pytest.fixture(scope="session")
def dcu_module():
    """dcu_module(host, "dcu.serving.dcu_facts", sysfs_root=...) -> the module's result."""
    return module


# A changed copy of the scenario's bundle (airgap's proxy venv, fleet's gateway venv).
def bundle_copy(tmp_path: Path, name: str, change) -> str:
    """index.json and wheels/ of the scenario's bundle (build/bundle) in tmp_path/name, with change(index, root)
    applied."""
    root = tmp_path / name
    shutil.copytree(PROJECT / "build/bundle/wheels", root / "wheels")
    index = json.loads((PROJECT / "build/bundle/index.json").read_text())
    change(index, root)
    (root / "index.json").write_text(json.dumps(index))
    return str(root)


def wheel_entry(index: dict, name: str) -> dict:
    return next(a for a in index["artifacts"] if a["kind"] == "wheel" and a["name"] == name)


def rebuild_wheel(index: dict, root: Path, name: str) -> None:
    """The wheel rebuilt with one more file (<package>/_rebuilt.txt), its new sum and size in index.json: a new
    venv for whoever installs it."""
    wheel = wheel_entry(index, name)
    with zipfile.ZipFile(root / wheel["file"], "a") as z:
        z.writestr(f"{name.replace('-', '_')}/_rebuilt.txt", "rebuilt\n")
    data = (root / wheel["file"]).read_bytes()
    wheel.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))


# The serving scenarios' helpers (default, platform, airgap).
RESULTS = "/var/log/dcu-serving/results.jsonl"


def results_line(host, orid: str, path: str = RESULTS) -> dict:
    """The results-log record of orid (the log is written by a thread: poll for it)."""
    from support import wait_until  # tests/support.py, on pytest's pythonpath

    def find():
        for line in host.file(path).content_string.splitlines():
            record = json.loads(line)
            if record.get("orid") == orid:
                return record
        return None
    return wait_until(find, 10, interval=0.2, what=f"the line of orid {orid} in {path}")


@contextlib.contextmanager
def steady_load(url: str, model: str, callers: int = 6, headers: dict | None = None):
    """Light steady load on url's chat API while the block runs: yields the list of (status, X-Backend or error),
    one per request, complete once the block has ended. No client-side retries: every failure the proxy (or
    gateway) lets through counts."""
    import threading

    import requests

    outcomes: list = []
    stop = threading.Event()

    def caller():
        session = requests.Session()
        while not stop.is_set():
            body = {"model": model, "user": "mol-load", "max_tokens": 30,
                    "chat_template_kwargs": {"enable_thinking": False},
                    "messages": [{"role": "user", "content": "ping"}]}
            try:
                resp = session.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
                outcomes.append((resp.status_code, resp.headers.get("X-Backend")))
            except requests.RequestException as exc:
                outcomes.append((None, str(exc)))

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def unit_property(host, unit: str, prop: str) -> str:
    return host.check_output(f"systemctl show --property={prop} --value {unit}")


@pytest.fixture(scope="session")
def node_name():
    return f"dcu-mol-{os.environ['MOLECULE_SCENARIO_NAME']}-node"


@pytest.fixture(scope="session")
def proxy_url(node_name):
    """The proxy as a business caller reaches it: the node's address, port 8000."""
    address = subprocess.run(["docker", "inspect", "--format", "{{.NetworkSettings.IPAddress}}", node_name],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert address, f"{node_name} has no address on Docker's bridge"
    return f"http://{address}:8000"


@pytest.fixture
def image_file(tmp_path):
    """A small real PNG (a receipt-like white page with a dark bar)."""
    from PIL import Image, ImageDraw

    path = tmp_path / "page.png"
    page = Image.new("RGB", (320, 240), "white")
    ImageDraw.Draw(page).rectangle((20, 20, 300, 60), fill="black")
    page.save(path)
    return path


@pytest.fixture(name="run_playbook", scope="session")
def run_playbook_fixture():
    """run_playbook("serving.yml", "--check", extra_vars={...}) -> (rc, output)."""
    return run_playbook


@pytest.fixture(name="start_playbook", scope="session")
def start_playbook_fixture():
    """start_playbook("stage.yml", extra_vars={...}) -> the running ansible-playbook (Popen, own process group)."""
    return start_playbook


@pytest.fixture(name="kill_playbook", scope="session")
def kill_playbook_fixture():
    """kill_playbook(proc): SIGKILL a playbook from start_playbook and every process it started."""
    return kill_playbook


@pytest.fixture(name="unit", scope="session")
def unit_fixture():
    """unit(host, "vllm@5", "NRestarts") -> a systemd property of the unit."""
    return unit_property
