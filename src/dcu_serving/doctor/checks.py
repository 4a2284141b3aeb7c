"""The checks, read-only, in the order a fault propagates: a driver that is not loaded explains a silent
hy-smi, missing nodes and every vLLM unit down, so its finding comes first and the operator fixes top down.

Each check returns findings: (check, status, message, fix). ok and warn need no action to serve; fail
does, and says how. `skip` is a part this host does not run (no vLLM instances, no proxy): not installed
is not a fault.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

from dcu_serving import addresses, container_engine, dtk_driver, host_kernel, hysmi, rock_version
from dcu_serving.doctor.host import (
    AUDIT_LOG,
    DRIVER_BOOT_UNIT,
    DRIVER_BOOT_WANTS,
    EXPORTER_UNIT,
    INSTALL_RECORD,
    PROXY_CONFIG,
    PROXY_UNIT,
    REBOOT_MARKER,
    VLLM_UNIT,
    Host,
    gib,
)

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
DRIVERS_FIX = "run playbooks/drivers.yml"


@dataclass
class Finding:
    check: str
    status: str
    message: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


# --- driver --------------------------------------------------------------------------------------------


def driver(host: Host) -> list:
    module, version = hysmi.loaded_driver(host.roots.sysfs)
    functions = hysmi.pci_functions(host.roots.sysfs)
    cards = hysmi.sysfs_cards(functions)
    unbound = [f for f in functions if f["kind"] == "unbound"]
    host.facts.update(module=module, driver_version=version, cards=cards)
    if module is None:
        devices = len(unbound) + len(cards)
        return [Finding("driver", FAIL, f"no DCU kernel module (hycu, or hydcu up to 6.2) is loaded; {devices} DCU "
                        "device(s) on the PCI bus",
                        "/opt/hyhal/bin/hy-smi --loaddriver (or modprobe hycu); after an install, reboot. "
                        "Not installed: " + DRIVERS_FIX)]
    findings = []
    expected = int(host.access_record().get("expected_cards") or 0)
    summary = "{} {} loaded; {} card(s) bound".format(module, version or "(no version file)", len(cards))
    if unbound:
        findings.append(Finding("driver", FAIL, "{}, but these cards have no DRM nodes: {}".format(
            summary, "; ".join(hysmi.describe_function(f) for f in unbound)),
            "a driver/vbios mismatch or a half-finished install leaves cards down: dmesg | grep -i hycu; "
            "reinstall the driver with playbooks/drivers.yml (dcu_driver_update_vbios) and reboot"))
    elif expected and len(cards) != expected:
        findings.append(Finding("driver", FAIL, f"{summary}, {expected} expected (dcu_driver_expected_cards)",
                                "lspci -d 1d94: shows what the bus holds; a missing card is a hardware or BIOS "
                                "matter; a changed count: set dcu_driver_expected_cards and rerun drivers.yml"))
    else:
        findings.append(Finding("driver", OK, summary + (f" of {expected} expected" if expected else "")))
    return findings


def hymgr(host: Host) -> list:
    state = host.unit_states(["hymgr"]).get("hymgr", "unknown")
    findings = []
    if state != "active":
        findings.append(Finding("hymgr", FAIL, f"hymgr.service is {state}: hy-smi answers nothing without it",
                                "systemctl start hymgr (systemctl enable hymgr, so it starts at boot); "
                                "journalctl -u hymgr -n 50 says why it stopped"))
    smi = host.hy_smi()
    if smi is None:
        findings.append(Finding("hymgr", FAIL, "no hy-smi at {}".format(host.path("hyhal", "bin", "hy-smi")),
                                "/opt/hyhal links to /usr/local/hyhal, which the driver installs: " + DRIVERS_FIX))
        return findings
    rc, out = host.run([smi, "--showdriverversion"])
    if rc != 0:
        why = hysmi.explain_failure(out) or "see its output"
        findings.append(Finding("hymgr", FAIL, f"hy-smi --showdriverversion exited {rc}: {out.strip()[-200:]}",
                                why))
        return findings
    host.facts["smi_driver_version"] = hysmi.parse_driver_version(out)
    if state == "active":
        findings.append(Finding("hymgr", OK, "hymgr.service active; hy-smi answers (driver {})".format(
            host.facts["smi_driver_version"] or "version not printed")))
    return findings


# --- device nodes and groups ---------------------------------------------------------------------------


def _nodes(host: Host) -> list:
    """The nodes HIP opens: kfd (mkfd where the driver makes one) and each bound card's render and card node."""
    cards = host.facts.get("cards")
    if cards is None:
        cards = hysmi.sysfs_cards(hysmi.pci_functions(host.roots.sysfs))
    names = ["kfd", "mkfd"]
    for card in cards:
        names += ["dri/" + card[key] for key in ("render", "card") if card.get(key)]
    return [(name, host.path("dev", name)) for name in names]


def device_nodes(host: Host) -> list:
    findings, stats = [], {}
    damaged = host.access_record_damaged()
    if damaged:
        findings.append(Finding("device nodes", WARN, f"{damaged} is not valid JSON: which service users need the "
                                                      f"nodes is not known, only dcu-serving and --user are checked",
                                DRIVERS_FIX + " (it writes the record again)"))
    groups = host.groups()
    for name, path in _nodes(host):
        try:
            stats[name] = os.stat(path)
        except OSError:
            if name != "mkfd":  # only some drivers make /dev/mkfd
                findings.append(Finding("device nodes", FAIL, f"{path} is missing",
                                        "the driver creates it when it loads and binds the cards (see driver): "
                                        "hy-smi --loaddriver, then udevadm trigger"))
    if not stats:
        return findings
    loose = sorted(path for path, st in stats.items() if st.st_mode & (stat.S_IROTH | stat.S_IWOTH))
    if loose:
        # The rules act when a node is made: nodes made before 70-dcu.rules existed keep Hygon's mode.
        rules = os.path.exists(host.path("etc", "udev/rules.d/70-dcu.rules"))
        findings.append(Finding(
            "device nodes", WARN, "world-accessible: /dev/{} (Hygon's 16-dcu.rules make kfd and mkfd 0666)".format(
                ", /dev/".join(loose)),
            "udevadm trigger --action=change --subsystem-match=kfd --subsystem-match=mkfd --subsystem-match=drm "
            "applies 70-dcu.rules (0660), as does a reboot" if rules
            else "playbooks/drivers.yml installs 70-dcu.rules, which makes them 0660"))
    # Which group opens which nodes: the role keeps Hygon's (render for kfd and renderD*, video for card*).
    by_group = {}
    for name, st in stats.items():
        by_group.setdefault(st.st_gid, []).append(name)
    passwd = host.passwd()
    users = host.service_users()
    for user in users:
        if user not in passwd:
            findings.append(Finding("device nodes", FAIL, f"service user {user} does not exist",
                                    DRIVERS_FIX + " (it creates the service users)"))
            continue
        for gid, names in sorted(by_group.items()):
            group, members = groups.get(gid, (str(gid), []))
            if gid == 0 or passwd[user] == gid or user in members:
                continue
            findings.append(Finding(
                "device nodes", FAIL, f"{user} is not in group {group}, which owns {_node_list(names)}",
                f"usermod -aG {group} {user} (then restart its services), or {DRIVERS_FIX}"))
    for gid, names in sorted(by_group.items()):
        if gid == 0 and any(stats[name].st_mode & stat.S_IRWXG for name in names):
            findings.append(Finding("device nodes", WARN,
                                    f"{_node_list(names)} belong to group root: only root and the world open them",
                                    "udevadm trigger applies the rules' groups; " + DRIVERS_FIX))
    if not any(f.status == FAIL for f in findings):
        findings.append(Finding("device nodes", OK, "{} nodes; {} open them through {}".format(
            len(stats), ", ".join(users) or "no service user recorded",
            ", ".join(sorted({groups.get(gid, (str(gid),))[0] for gid in by_group})))))
    return findings


def _node_list(names: list) -> str:
    names = sorted(names, key=lambda n: (len(n), n))
    shown = ["/dev/" + n for n in names[:3]]
    return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


# --- versions --------------------------------------------------------------------------------------------


def versions(host: Host) -> list:
    findings = []
    loaded = host.facts.get("driver_version") or host.facts.get("smi_driver_version")
    record = host.read_json(host.path("state", INSTALL_RECORD))
    if record.get("version") and loaded and rock_version.differs(record["version"], loaded):
        findings.append(Finding("versions", FAIL, "rock {} is installed ({}), but {} is loaded".format(
            record["version"], record.get("file", "the install record"), loaded),
            "reboot (the new module loads at boot), or playbooks/drivers.yml -e dcu_driver_reboot=true"))
    elif os.path.exists(os.path.join(host.roots.run, os.path.basename(REBOOT_MARKER))):
        findings.append(Finding("versions", WARN, f"the driver's installer asked for a reboot ({REBOOT_MARKER})",
                                "reboot when the host can be drained"))
    dtk = (host.read(host.path("dtk", ".info", "rocm_version")) or "").strip()
    checks = [("the host's DTK", dtk)] if dtk else []
    # An image's DTK: its dcu-serving.dtk label, else its tag as Hygon names images (...-dtk26.04-py3.10).
    for image in sorted({i.image for i in host.instances() if i.image}):
        image_id, labels = host.image(image)
        checks.append(("image " + image, (labels.get("dcu-serving.dtk") if image_id else None) or image))
    for what, text in checks:
        findings.append(_table(what, text, loaded))
    if not findings:
        findings.append(Finding("versions", SKIP, f"no DTK at {host.roots.dtk} and no images configured: nothing "
                                "to hold against the driver"))
    elif not any(f.status in (FAIL, WARN) for f in findings):
        return [Finding("versions", OK, "the DTK <-> driver table allows driver {} with {}".format(
            loaded, "; ".join(f.message for f in findings)))]
    return findings


def _table(what: str, text: str, driver_version: str | None) -> Finding:
    version = dtk_driver.dtk_version(text)
    entry = dtk_driver.row(version)
    if entry is None:
        if not version:
            return Finding("versions", WARN, f"{what}: no DTK version in its label or tag, so the DTK <-> driver "
                           "table cannot be applied", "label the image dcu-serving.dtk=<version> where it is built, "
                           "or check its DTK against Hygon's table by hand")
        return Finding("versions", WARN, f"{what}: DTK {version} is not in the DTK <-> driver table "
                       f"({dtk_driver.SNAPSHOT})", "check it against Hygon's current table by hand")
    if not driver_version:
        return Finding("versions", WARN, f"{what}: the driver's version is unknown, so "
                       f"{dtk_driver.describe(entry)} cannot be checked", "hy-smi --showdriverversion prints it")
    answer = dtk_driver.supports(entry, driver_version)
    if answer is False:
        others = dtk_driver.dtks_for(driver_version)
        return Finding(
            "versions", FAIL, f"{what}: {dtk_driver.describe(entry)} does not allow the loaded driver {driver_version}",
            "install a driver that row allows ({}) with playbooks/drivers.yml, or use a DTK this driver "
            "supports ({})".format(entry["shipped"], ", ".join(others) or "none in the table"))
    if answer is None:
        return Finding("versions", WARN, f"{what}: {dtk_driver.describe(entry)} cannot be decided for driver "
                       f"{driver_version}", "read the build with hy-smi --showdriverversion")
    return Finding("versions", OK, f"{what}: DTK {version}")


# --- images, units, ports ------------------------------------------------------------------------------


def images(host: Host) -> list:
    instances = [i for i in host.instances() if i.image]
    if not instances:
        return [Finding("images", SKIP, "no vLLM container instances configured ({}/*.env): dcu_vllm not "
                        "installed or runtime host".format(host.path("etc", "dcu-serving/vllm")))]
    findings = []
    for image in sorted({i.image for i in instances}):
        users = [i for i in instances if i.image == image]
        units = _unit_list(users)
        image_id, why = host.image(image)
        if image_id is None:
            findings.append(Finding("images", FAIL, f"{image} (for {units}) is not in Docker: {why}",
                                    "playbooks/images.yml loads it from the bundle (the hosts pull nothing)"))
            continue
        stale = [i for i in users if i.image_id and i.image_id.startswith("sha256:") and i.image_id != image_id]
        # vllm@.service runs an image by the ID its env file names (a rollback restarts exactly that one): an ID
        # Docker no longer holds is a unit that cannot start again, whatever the tag holds now.
        gone = [i for i in stale if host.image(i.image_id)[0] is None]
        if gone:
            findings.append(Finding("images", FAIL, f"{_unit_list(gone)} run {image} by its ID "
                                    f"{gone[0].image_id[:19]}, which Docker no longer holds: "
                                    f"{'its' if len(gone) == 1 else 'their'} next start fails",
                                    f"playbooks/serving.yml converges them on the {image} loaded now "
                                    f"({image_id[:19]})"))
        elif stale:
            findings.append(Finding("images", WARN, f"{image} is now {image_id[:19]}, but {_unit_list(stale)} "
                                    f"run {stale[0].image_id[:19]} (by ID: a rollback keeps them on it)",
                "playbooks/serving.yml restarts them on the loaded image"))
        else:
            findings.append(Finding("images", OK, f"{image} present ({image_id[:19]}) for {units}"))
    return findings


def _image_fix(host: Host) -> str:
    """How to free space among the images without touching one a vLLM unit runs or rolls back to: `docker image
    prune` would delete an image whose tag was re-released, which a unit still runs by ID."""
    kept = {i.image_id for i in host.instances() if (i.image_id or "").startswith("sha256:")}
    kept |= {host.image(i.image)[0] for i in host.instances() if i.image} - {None}
    dangling = host.dangling_images()
    if dangling is None:
        return ""
    removable = [image_id for image_id in dangling if image_id not in kept]
    protected = sorted(image_id[7:19] for image_id in set(dangling) & kept)
    keep = (f" (not docker image prune: it would delete {', '.join(protected)}, which vLLM units run or roll "
            "back to)") if protected else ""
    if removable:
        return f"docker image rm {' '.join(image_id[7:19] for image_id in removable)}{keep}"
    return f"no untagged image is left over{keep}"


def units(host: Host) -> list:
    instances = host.instances()
    wanted = [i.unit for i in instances]
    if any(i.image for i in instances):
        wanted.insert(0, "docker")
    proxy = os.path.exists(host.path("etc", PROXY_UNIT))
    if proxy:
        wanted.append("dcu-proxy")
    if not wanted:
        return [Finding("units", SKIP, "no vllm@ or dcu-proxy units installed (dcu_vllm, dcu_proxy not run)")]
    states = host.unit_states(wanted)
    findings = []
    for unit, state in states.items():
        if state == "active":
            continue
        fix = f"journalctl -u {unit} -n 100 says why; then systemctl reset-failed {unit} && systemctl start {unit}"
        if unit.startswith("vllm@"):
            fix += " (or playbooks/rolling_restart.yml)"
        findings.append(Finding("units", FAIL, f"{unit} is {state}", fix))
    if not findings:
        findings.append(Finding("units", OK, f"{_short(list(states))} active"))
    if not proxy:
        findings.append(Finding("units", SKIP, "dcu-proxy not installed"))
    return findings


# The data layer's units (roles/dcu_milvus, roles/dcu_mineru), in the order they depend on one another, with
# what stops when each is down.
DATA_UNITS = (("dcu-etcd", "Milvus' metadata store: Milvus cannot serve without it"),
              ("dcu-milvus", "the vector store: the RAG chain cannot store or search"),
              ("dcu-mineru", "document parsing: no PDF can be parsed"))


def data_services(host: Host) -> list:
    installed = [(unit, role) for unit, role in DATA_UNITS
                 if os.path.exists(host.path("etc", "systemd", "system", unit + ".service"))]
    if not installed:
        return [Finding("data", OK, "no data service on this host (dcu_milvus and dcu_mineru install them)")]
    states = host.unit_states([unit for unit, _ in installed])
    findings = [Finding("data", FAIL, f"{unit} is {states.get(unit, 'unknown')} ({role})",
                        f"journalctl -u {unit} -n 100 says why; then systemctl start {unit}")
                for unit, role in installed if states.get(unit) != "active"]
    return findings or [Finding("data", OK, ", ".join(unit for unit, _ in installed) + " active")]


def _listen_address(listen: str | None) -> tuple | None:
    """('127.0.0.1', 8000) for '0.0.0.0:8000': where a local client reaches a listener (the collection's own
    reading of HOST:PORT, dcu_serving/addresses.py); None when there is none."""
    try:
        host, port = addresses.split_listen(listen)
    except addresses.ListenError:
        return None
    return addresses.local_host(host), port


def _expected_ports(host: Host) -> list:
    # The instances listen where vllm@.service's `--host` says (dcu_vllm_listen_host, loopback by default).
    listen = re.search(r"--host\s+(\S+)", host.read(host.path("etc", VLLM_UNIT)) or "")
    address = addresses.local_host((listen.group(1) if listen else "127.0.0.1").strip("[]"))
    ports = [(f"{i.unit} ({i.model or 'model'})", (address, i.port), i.unit) for i in host.instances() if i.port]
    config = host.proxy_config()
    if config is not None:
        for what, listen in (("dcu-proxy", config.get("listen")),
                             ("dcu-proxy admin", (config.get("admin") or {}).get("listen"))):
            address = _listen_address(listen)
            if address:
                ports.append((what, address, "dcu-proxy"))
    return ports


def ports(host: Host) -> list:
    expected = _expected_ports(host)
    if not expected:
        return [Finding("ports", SKIP, "no vLLM instance or proxy configured: no port to check")]
    findings = []
    for what, (address, port), unit in expected:
        try:
            with socket.create_connection((address, port), timeout=min(host.timeout, 3)):
                pass
        except OSError as exc:
            findings.append(Finding(
                "ports", FAIL, f"{what}: nothing answers on {address}:{port} ({exc.strerror or exc})",
                f"see units: {unit} must be active; ss -ltnp 'sport = :{port}' shows who holds the port"))
    if not findings:
        findings.append(Finding("ports", OK, "listening: " + ", ".join(
            "{}:{}".format(*address) for _what, address, _unit in expected)))
    return findings


def proxy(host: Host) -> list:
    config = host.proxy_config()
    address = _listen_address((config or {}).get("listen"))
    if address is None:
        return [Finding("proxy", SKIP, "dcu-proxy not installed ({} absent)".format(
            host.path("etc", PROXY_CONFIG)))]
    url = f"http://{addresses.url_host(address[0])}:{address[1]}/__lb_status"
    try:
        with urllib.request.urlopen(url, timeout=min(host.timeout, 5)) as response:
            status = json.loads(response.read())
    except (OSError, ValueError) as exc:
        return [Finding("proxy", FAIL, f"GET {url} failed: {exc}",
                        "see units and ports: journalctl -u dcu-proxy -n 100")]
    healthy, total = status.get("healthy", 0), status.get("total", 0)
    down = ["{} ({})".format(b.get("url"), b.get("last_error") or "unhealthy")
            for b in status.get("backends", []) if not b.get("healthy")]
    message = "{}/{} backends healthy, {} queued".format(healthy, total, status.get("queue", 0))
    trio = ("which card answered a request: its X-Backend header; what happened to it: the results log line "
            "with its orid")
    if total == 0:
        return [Finding("proxy", FAIL, message + ": the proxy has no backend", "its proxy.yml lists none: "
                        "run playbooks/serving.yml")]
    if healthy < total:
        return [Finding("proxy", FAIL if healthy == 0 else WARN, message + "; down: " + "; ".join(down),
                        "journalctl -u vllm@N for each down backend (port 8002 is vllm@0 in the default "
                        "layout); " + trio)]
    return [Finding("proxy", OK, message + " (" + url + ")")]


# --- disk, shm -------------------------------------------------------------------------------------------


def disk(host: Host, min_free_gib: float = 20.0) -> list:
    """Free space where images and the bundle land: Docker's root and the role's state directory."""
    rc, out = host.run(["docker", "info", "--format", "{{.DockerRootDir}}"])
    places = [out.strip() if rc == 0 and out.strip().startswith("/") else None, host.roots.state]
    findings, seen = [], set()
    for place in places:
        existing = place
        while existing and not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not existing:
            continue
        st = os.statvfs(existing)
        if st.f_fsid in seen:
            continue
        seen.add(st.f_fsid)
        free = st.f_bavail * st.f_frsize
        if free < min_free_gib * 1024 ** 3:
            images_fix = _image_fix(host)
            findings.append(Finding(
                "disk", FAIL, f"{gib(free)} free on the filesystem of {place} (at least {min_free_gib:g} GiB wanted: "
                "a vLLM image is tens of GiB, loaded from a tarball beside it)",
                (f"{images_fix}; " if images_fix else "")
                + f"remove old bundles under {host.roots.state}; --min-free-gib sets the bound"))
        else:
            findings.append(Finding("disk", OK, f"{gib(free)} free for {place}"))
    return findings


def _size(text: str) -> int | None:
    match = re.match(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?$", text.strip().lower())
    if not match:
        return None
    return int(float(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " "))


def shm(host: Host) -> list:
    """vLLM's workers share tensors through /dev/shm: the host's (runtime host) or each container's own
    --shm-size, which is memory: eight containers of 16g promise 128 GiB."""
    findings = []
    path = host.path("dev", "shm")
    try:
        st = os.statvfs(path)
    except OSError:
        return [Finding("shm", FAIL, f"{path} is missing", "mount it: mount -t tmpfs tmpfs /dev/shm "
                        "(and in /etc/fstab); systemd mounts it at boot")]
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    meminfo = host.read(os.path.join(host.roots.proc, "meminfo")) or ""
    match = re.search(r"(?m)^MemTotal:\s+(\d+) kB", meminfo)
    memory = int(match.group(1)) * 1024 if match else None
    containers = [i for i in host.instances() if i.image]
    unit = host.read(host.path("etc", VLLM_UNIT)) or ""
    per = re.search(r"--shm-size[= ](\S+)", unit)
    shm_size = _size(per.group(1)) if per else None
    if containers and shm_size and memory and shm_size * len(containers) > memory:
        total = gib(shm_size * len(containers))
        findings.append(Finding("shm", WARN, f"{len(containers)} containers x --shm-size {per.group(1)} = {total} "
                                f"of shared memory, more than the host's {gib(memory)} RAM",
                                "set dcu_vllm_container_shm_size so that instances x size fits in RAM"))
    elif host.instances() and not containers and free < 1024 ** 3:
        findings.append(Finding("shm", FAIL, f"{gib(free)} free of {gib(size)} in {path}; the host-runtime "
                                "instances share it", "find what fills it (ls -la /dev/shm); raise its size in "
                                "/etc/fstab"))
    if not findings:
        findings.append(Finding("shm", OK, "{} free of {} in {}{}".format(
            gib(free), gib(size), path, f"; containers get --shm-size {per.group(1)} each"
            if containers and per else "")))
    return findings


def _unit_list(instances: list) -> str:
    return _short([i.unit for i in instances])


def _short(names: list) -> str:
    return ", ".join(names) if len(names) <= 4 else "{}, ... {} ({} units)".format(
        ", ".join(names[:2]), names[-1], len(names))


# --- the host around the cards (docs/field-evidence.md, section 8) -----------------------------------------


def _blacklists(host: Host, module: str) -> list:
    """The modprobe.d files that blacklist module: what systemd-modules-load honours at boot."""
    directory = host.path("etc", "modprobe.d")
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".conf"))
    except OSError:
        return []
    return [os.path.join(directory, name) for name in names
            if any(line.split("#")[0].split() == ["blacklist", module]
                   for line in (host.read(os.path.join(directory, name)) or "").splitlines())]


def boot(host: Host) -> list:
    """Will the driver load at the next boot? Hygon's installer blacklists it, which voids modules-load.d."""
    modules = [host.facts["module"]] if host.facts.get("module") else list(hysmi.DRIVER_MODULES)
    blacklisted = {module: files for module in modules if (files := _blacklists(host, module))}
    unit = os.path.exists(host.path("etc", DRIVER_BOOT_UNIT))
    enabled = os.path.lexists(host.path("etc", DRIVER_BOOT_WANTS))
    if not blacklisted:
        return [Finding("boot", OK, "no modprobe blacklist for {}: the kernel loads it by the cards' PCI ids"
                        .format(" or ".join(modules)) + ("; dcu-driver.service as well" if enabled else ""))]
    module, files = next(iter(blacklisted.items()))
    said = "{} is blacklisted in {} (Hygon's installer writes it), so /etc/modules-load.d does not load it".format(
        module, ", ".join(files))
    if unit and enabled:
        return [Finding("boot", OK, said + "; dcu-driver.service loads it at boot")]
    return [Finding("boot", FAIL, said + ", and dcu-driver.service is {}: the driver will not come back after a "
                    "reboot".format("installed but not enabled" if unit else "not installed"),
                    "playbooks/drivers.yml installs and enables dcu-driver.service; until then, after every boot: "
                    "/opt/hyhal/bin/hy-smi --loaddriver && systemctl restart hymgr")]


def _container_units(host: Host) -> dict:
    """{unit: its text} of the units that run containers (vllm@ with the container runtime, the proxy's and the
    exporter's container units)."""
    found = {}
    for name, path in (("vllm@.service", VLLM_UNIT), ("dcu-proxy.service", PROXY_UNIT),
                       ("dcu-exporter.service", EXPORTER_UNIT)):
        # The unit's directives only: its comments may name flags it does not pass.
        text = "\n".join(line for line in (host.read(host.path("etc", path)) or "").splitlines()
                         if not line.lstrip().startswith(("#", ";")))
        if re.search(r"\bdocker\b.*\brun\b", text):
            found[name] = text
    return found


def engine(host: Host) -> list:
    units = _container_units(host)
    if not units:
        return [Finding("engine", SKIP, "no unit runs a container (dcu_vllm's host runtime, or nothing installed)")]
    rc, out = host.run(["docker", "version", "--format", "{{.Server.Version}}"])
    if rc != 0:
        return [Finding("engine", FAIL, "docker does not answer (exit {}): {}".format(rc, " ".join(out.split())[-160:]),
                        "systemctl status docker; journalctl -u docker -n 50")]
    version = container_engine.parse_version(out)
    problem = container_engine.problem(out)
    if problem:
        return [Finding("engine", FAIL, problem, container_engine.UPGRADE)]
    refused = [flag.split("=")[0] for flag, _since in container_engine.RUN_FLAGS_SINCE
               if flag not in container_engine.run_flags(version)]
    stale = sorted(unit for unit, text in units.items() for flag in refused if flag in text)
    shown = out.strip().splitlines()[0]
    if stale:
        return [Finding("engine", FAIL, "docker {} does not know {}, which {} pass: their containers cannot "
                        "start".format(shown, ", ".join(refused), ", ".join(stale)),
                        "playbooks/serving.yml renders the units for the host's engine")]
    return [Finding("engine", OK, "docker {} runs {}".format(shown, ", ".join(sorted(units))))]


def selinux(host: Host) -> list:
    state = (host.read(host.path("sysfs", "fs", "selinux", "enforce")) or "").strip()
    if state not in ("0", "1"):
        return [Finding("selinux", OK, "SELinux is not enabled")]
    mode = "enforcing" if state == "1" else "permissive"
    units = _container_units(host)
    unlabelled = sorted(unit for unit, text in units.items() if not re.search(r"label[=:]disable", text))
    denials = [line for line in (host.read(os.path.join(host.roots.log, AUDIT_LOG)) or "").splitlines()
               if "avc:" in line and "denied" in line and "container_t" in line]
    findings = []
    if mode == "enforcing" and unlabelled:
        findings.append(Finding("selinux", FAIL, "SELinux is enforcing and {} mount host paths (the model, "
                                "/opt/hyhal) with no label option: the containers cannot read them".format(
                                    ", ".join(unlabelled)),
                                "playbooks/serving.yml renders them with --security-opt label=disable, as Hygon's "
                                "recipes run DCU containers"))
    if denials:
        path = re.search(r'path="([^"]*)"', denials[-1])
        findings.append(Finding("selinux", WARN if mode == "permissive" or not unlabelled else FAIL,
                                "{} SELinux denial(s) for containers in {}; the last for {}".format(
                                    len(denials), os.path.join(host.roots.log, AUDIT_LOG),
                                    path.group(1) if path else "an unnamed path"),
                                "ausearch -m avc -ts recent names each; containers started before the units ran "
                                "with label=disable restart with playbooks/rolling_restart.yml"))
    if not findings:
        findings.append(Finding("selinux", OK, "SELinux is {}; {}".format(
            mode, "the containers run with label=disable" if units else "no container units")))
    return findings


def _tensor_parallel(instance) -> int:
    found = re.search(r"(?:--tensor-parallel-size|-tp)[=\s]+(\d+)", instance.serve_args or "")
    return int(found.group(1)) if found else 1


def kernel(host: Host) -> list:
    """What tensor parallelism over PCIe and BW cards need from the kernel (docs/field-evidence.md K1, O13)."""
    cards = host.facts.get("cards") or []
    series = [hysmi.SERIES_BY_DEVICE.get(card.get("device_id")) for card in cards]
    units = [i.unit for i in host.instances() if _tensor_parallel(i) > 1]
    over_pcie = bool(units) and hysmi.interconnect(series) != "hlink"
    findings = []
    if over_pcie:
        cmdline = host.read(host.path("proc", "cmdline"))
        balancing = host.read(host.path("proc", "sys", "kernel", "numa_balancing"))
        for what, fix in host_kernel.tensor_parallel_problems(cmdline, balancing):
            findings.append(Finding("kernel", WARN, f"{_short(units)} run tensor parallel over PCIe, and {what}", fix))
    bw = any(hysmi.series_key(name).startswith("BW") for name in series)
    problem = host_kernel.map_count_problem(host.read(host.path("proc", "sys", "vm", "max_map_count"))) if bw else ""
    if problem:
        findings.append(Finding("kernel", FAIL, problem, "playbooks/drivers.yml sets it (/etc/sysctl.d/"
                                f"90-dcu-serving.conf); now: sysctl -w vm.max_map_count={host_kernel.MAX_MAP_COUNT}"))
    if not findings:
        looked = [what for what, applies in (("iommu and NUMA balancing for tensor parallel over PCIe", over_pcie),
                                             ("vm.max_map_count for BW cards", bw)) if applies]
        findings.append(Finding("kernel", OK, "checked " + " and ".join(looked) if looked
                                else "no tensor parallel over PCIe and no BW cards: nothing to check"))
    return findings


# In order: the driver before what needs it, the services before the proxy in front of them.
CHECKS = [
    ("driver", driver),
    ("hymgr", hymgr),
    ("boot", boot),
    ("device nodes", device_nodes),
    ("versions", versions),
    ("engine", engine),
    ("selinux", selinux),
    ("kernel", kernel),
    ("images", images),
    ("units", units),
    ("ports", ports),
    ("proxy", proxy),
    ("data", data_services),
    ("disk", disk),
    ("shm", shm),
]


def run_all(host: Host, min_free_gib: float = 20.0) -> list:
    findings = []
    for name, check in CHECKS:
        try:
            found = check(host, min_free_gib) if check is disk else check(host)
        except Exception as exc:  # a doctor that crashes on a broken host tells nothing about the rest
            found = [Finding(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}",
                             "report it with this output (dcu-doctor --json)")]
        findings.extend(found)
    return findings
