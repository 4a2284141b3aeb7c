"""The emulated node's kernel and udev, shared by its boot (dcu-emu-boot) and its modprobe.

Only the node image uses this; roles and modules read sysfs and /dev as on a real host. docs/emulation.md.
"""

import fnmatch
import grp
import json
import os
import re
import stat
from pathlib import Path

PROFILE_FILE = Path("/run/dcu-emu/profile.json")
OS_FILE = Path("/run/dcu-emu/os.json")
RULE_DIRS = ("/lib/udev/rules.d", "/run/udev/rules.d", "/etc/udev/rules.d")
MODPROBE_DIRS = ("/lib/modprobe.d", "/usr/lib/modprobe.d", "/run/modprobe.d", "/etc/modprobe.d")
_TOKEN = re.compile(r'\s*([A-Za-z_]+)(\{[^}]*\})?\s*(==|!=|\+=|:=|=)\s*"([^"]*)"\s*,?')


def settings():
    values = {}
    for line in Path("/etc/dcu-emu.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def sysfs_root():
    return Path(settings().get("DCU_EMU_SYSFS", "/run/dcu-emu/sys"))


def profile():
    return json.loads(PROFILE_FILE.read_text())


def blacklisted(module):
    """The modprobe.d files that blacklist module: kmod's deny-list, which stops loads by alias and
    systemd-modules-load (`modprobe -b`), not an explicit `modprobe <module>`."""
    found = []
    for directory in MODPROBE_DIRS:
        for conf in sorted(Path(directory).glob("*.conf")) if Path(directory).is_dir() else []:
            if any(line.split("#")[0].split() == ["blacklist", module] for line in conf.read_text().splitlines()):
                found.append(str(conf))
    return found


def rules():
    """Every udev rule that sets GROUP or MODE, in udev's order (file name; /etc overrides /lib)."""
    files = {}
    for directory in RULE_DIRS:
        for path in Path(directory).glob("*.rules") if Path(directory).is_dir() else []:
            files[path.name] = path
    for name in sorted(files):
        for line in files[name].read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            tokens = [(m.group(1) + (m.group(2) or ""), m.group(3), m.group(4)) for m in _TOKEN.finditer(line)]
            if any(key in ("GROUP", "MODE") and op in ("=", ":=") for key, op, _ in tokens):
                yield tokens


def _matches(pattern, value):
    return any(fnmatch.fnmatchcase(value or "", alternative) for alternative in pattern.split("|"))


def apply_rules(node, subsystem, driver=None, vendor=None):
    """What udev does to a new device node: the last matching GROUP and MODE win; without a MODE a node
    with a group is 0660, without either root:root 0600. Match keys this emulation does not know
    (ENV{...}, TAG, ...) make a rule not match."""
    group, mode, mode_set = "root", 0o600, False
    facts = {"KERNEL": os.path.basename(node), "SUBSYSTEM": subsystem, "ACTION": "add", "DRIVERS": driver,
             "ATTRS{vendor}": vendor, "DEVPATH": "/devices/" + os.path.basename(node)}
    for tokens in rules():
        matched = True
        for key, op, value in tokens:
            if op in ("==", "!=") and (_matches(value, facts[key]) if key in facts else False) != (op == "=="):
                matched = False
                break
        if not matched:
            continue
        for key, op, value in tokens:
            if key == "GROUP" and op in ("=", ":="):
                group = value
            elif key == "MODE" and op in ("=", ":="):
                mode, mode_set = int(value, 8), True
    if group != "root" and not mode_set:
        mode = 0o660
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:  # udev leaves the node to root when the rule's group does not exist
        gid = 0
    os.chown(node, 0, gid)
    os.chmod(node, mode)


def make_node(path, subsystem, driver=None, vendor=None):
    """A character device the container may use (it is /dev/null's 1:3, allowed by Docker by default)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    apply_rules(str(path), subsystem, driver, vendor)


# --- What the driver counts per card: gpu_busy_percent and mem_info_vram_used (dcu-emu-activity) ----------
IDLE_VRAM = 82 * 1024 * 1024  # what a real idle card reports used


def _json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _option(argv, name, default):
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def _argv(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def card_users(sys_root, docker_root=Path("/var/lib/docker"), proc=Path("/proc")):
    """{pid: (PCI addresses, argv)} of the vLLM servers holding cards: the processes a real driver lists per card.
    A container's cards are its render nodes (docker's record of its devices), or HIP_VISIBLE_DEVICES where it
    was given all of /dev/dri; a process on the host names them in HIP_VISIBLE_DEVICES."""
    render = {p.name: (p / "device").resolve().name for p in (sys_root / "class/drm").glob("renderD*")}
    by_index = [render[name] for name in sorted(render, key=lambda n: int(n[len("renderD"):]))]

    def visible(value):
        return [by_index[int(i)] for i in value.split(",") if i.strip().isdigit() and int(i) < len(by_index)]

    users = {}
    for config in (docker_root / "containers").glob("*/config.v2.json"):
        record = _json(config) or {}
        state = record.get("State") or {}
        if not state.get("Running") or not state.get("Pid"):
            continue
        env = dict(e.split("=", 1) for e in (record.get("Config") or {}).get("Env") or [] if "=" in e)
        devices = ((_json(config.with_name("hostconfig.json")) or {}).get("Devices")) or []
        cards = [render[os.path.basename(d.get("PathOnHost", ""))] for d in devices
                 if os.path.basename(d.get("PathOnHost", "")) in render]
        if "HIP_VISIBLE_DEVICES" in env:
            cards = visible(env["HIP_VISIBLE_DEVICES"])
        if cards:
            users[state["Pid"]] = (cards, _argv(state["Pid"]))
    for environ in proc.glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        try:
            env = dict(e.split("=", 1) for e in environ.read_bytes().decode(errors="replace").split("\0") if "=" in e)
        except OSError:
            continue
        argv = _argv(pid)
        if pid not in users and "HIP_VISIBLE_DEVICES" in env and "serve" in argv and "--port" in " ".join(argv):
            users[pid] = (visible(env["HIP_VISIBLE_DEVICES"]), argv)
    return users


def running_requests(port, timeout=0.5):
    """vllm:num_requests_running of the server on port (0 when it does not answer)."""
    import urllib.request
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except (OSError, ValueError):
        return 0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running") and " " in line)


def update_activity(sys_root, users):
    """Write each bound card's busy percent (the running sequences over --max-num-seqs of the server on it) and
    VRAM used (--gpu-memory-utilization of it, which vLLM takes at start and keeps; idle: 82 MiB)."""
    devices = sys_root / "bus/pci/devices"
    busy, vram = {}, {}
    for cards, argv in users.values():
        seqs = max(1, int(_option(argv, "--max-num-seqs", "256")))
        share = float(_option(argv, "--gpu-memory-utilization", "0.9"))
        percent = min(100, round(100 * running_requests(_option(argv, "--port", "8000")) / seqs))
        for bdf in cards:
            total = int((devices / bdf / "mem_info_vram_total").read_text().strip() or 0)
            busy[bdf] = max(busy.get(bdf, 0), percent)
            vram[bdf] = max(vram.get(bdf, IDLE_VRAM), int(share * total))
    for device in devices.iterdir():
        if not (device / "mem_info_vram_total").exists():
            continue
        for name, value in (("gpu_busy_percent", busy.get(device.name, 0)),
                            ("mem_info_vram_used", vram.get(device.name, IDLE_VRAM))):
            path = device / name
            if read_text(path) != str(value):
                temporary = device / f".{name}.new"
                temporary.write_text(f"{value}\n")
                temporary.replace(path)  # hy-smi never reads half a file


def read_text(path):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None
