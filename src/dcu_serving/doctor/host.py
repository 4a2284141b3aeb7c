"""The host as dcu-doctor reads it. Every path goes through a root, so the tests run against a fake tree,
and every command through run(), with a deadline: hy-smi blocks while hymgr does not answer."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from dcu_serving import host_paths

# Written by the roles (roles/dcu_driver, roles/dcu_vllm, roles/dcu_proxy), where the collection's one list of
# host paths says (dcu_serving/host_paths.py), under the doctor's roots (a test tree maps them elsewhere).
ACCESS_RECORD = host_paths.relative("access_record", host_paths.STATE_DIR)
INSTALL_RECORD = host_paths.relative("install_record", host_paths.STATE_DIR)
VLLM_ENV_DIR = host_paths.relative("vllm_env_dir", "/etc")
PROXY_CONFIG = host_paths.relative("proxy_config", "/etc")
PROXY_UNIT = host_paths.relative("proxy_unit", "/etc")
VLLM_UNIT = host_paths.relative("vllm_unit", "/etc")
EXPORTER_UNIT = host_paths.relative("exporter_unit", "/etc")
DRIVER_BOOT_UNIT = host_paths.relative("driver_boot_unit", "/etc")
DRIVER_BOOT_WANTS = "systemd/system/multi-user.target.wants/dcu-driver.service"
AUDIT_LOG = "audit/audit.log"
REBOOT_MARKER = host_paths.host_path("reboot_marker")


@dataclass
class Roots:
    sysfs: str = "/sys"
    dev: str = "/dev"
    etc: str = "/etc"
    proc: str = "/proc"
    state: str = host_paths.STATE_DIR
    hyhal: str = "/opt/hyhal"
    dtk: str = "/opt/dtk"
    run: str = "/run"
    log: str = "/var/log"


@dataclass
class Instance:
    """One vllm@NAME, from /etc/dcu-serving/vllm/NAME.env."""

    name: str
    port: int | None
    image: str | None
    image_id: str | None
    model: str | None
    serve_args: str = ""
    run_options: str = ""

    @property
    def unit(self) -> str:
        return "vllm@" + self.name


@dataclass
class Host:
    roots: Roots = field(default_factory=Roots)
    timeout: float = 10.0
    users: list = field(default_factory=list)  # --user: service users besides the recorded ones
    facts: dict = field(default_factory=dict)  # what one check learnt for the next (hy-smi's driver version)

    # --- files ---------------------------------------------------------------------------------------

    def path(self, root: str, *parts: str) -> str:
        return os.path.join(getattr(self.roots, root), *parts)

    @staticmethod
    def read(path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return None

    def read_json(self, path: str) -> dict:
        text = self.read(path)
        try:
            return json.loads(text) if text else {}
        except ValueError:
            return {}

    def access_record(self) -> dict:
        """dcu_driver's record: {users, groups: {compute, display}, expected_cards}; {} before the role ran."""
        return self.read_json(self.path("state", ACCESS_RECORD))

    def access_record_damaged(self) -> str | None:
        """The record's path when it is there but not a JSON object (the checks then fall back to defaults)."""
        path = self.path("state", ACCESS_RECORD)
        text = self.read(path)
        if not text:
            return None
        try:
            return None if isinstance(json.loads(text), dict) else path
        except ValueError:
            return path

    def service_users(self) -> list:
        recorded = self.access_record().get("users") or []
        users = list(recorded) + [user for user in self.users if user not in recorded]
        # Without the role's record: the role's default service user, where it exists.
        if not users and "dcu-serving" in self.passwd():
            users = ["dcu-serving"]
        return users

    def passwd(self) -> dict:
        """name -> primary gid, from <etc>/passwd (the service users are local system users)."""
        users = {}
        for line in (self.read(self.path("etc", "passwd")) or "").splitlines():
            parts = line.split(":")
            if len(parts) >= 4 and parts[3].isdigit():
                users[parts[0]] = int(parts[3])
        return users

    def groups(self) -> dict:
        """gid -> (name, members), from <etc>/group."""
        groups = {}
        for line in (self.read(self.path("etc", "group")) or "").splitlines():
            parts = line.split(":")
            if len(parts) >= 4 and parts[2].isdigit():
                groups[int(parts[2])] = (parts[0], [m for m in parts[3].strip().split(",") if m])
        return groups

    def instances(self) -> list:
        """The vLLM instances dcu_vllm configured, from their env files (none: dcu_vllm not installed)."""
        directory = self.path("etc", VLLM_ENV_DIR)
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(".env"))
        except OSError:
            return []
        found = []
        for name in names:
            env = parse_env(self.read(os.path.join(directory, name)) or "")
            port = env.get("DCU_VLLM_PORT", "")
            found.append(Instance(name[:-4], int(port) if port.isdigit() else None, env.get("DCU_VLLM_IMAGE"),
                                  env.get("DCU_VLLM_IMAGE_ID"), env.get("DCU_VLLM_MODEL"),
                                  env.get("DCU_VLLM_SERVE_ARGS", ""), env.get("DCU_VLLM_RUN_OPTIONS", "")))
        # vllm@2 before vllm@10, services by name
        return sorted(found, key=lambda i: [int(part) if part.isdigit() else part
                                            for part in re.split(r"(\d+)", i.name)])

    def proxy_config(self) -> dict | None:
        """proxy.yml as a mapping; None when dcu_proxy is not installed."""
        text = self.read(self.path("etc", PROXY_CONFIG))
        if text is None:
            return None
        try:
            import yaml  # in the proxy's venv; the zipapp on a bare host may run without it
        except ImportError:
            # proxy.yml is Ansible's to_nice_yaml: top-level `listen:` and admin's indented `listen:`.
            top = re.search(r"(?m)^listen:\s*['\"]?([^'\"\s]+)", text)
            admin = re.search(r"(?m)^admin:\s*\n(?:[ \t]+.*\n)*?[ \t]+listen:\s*['\"]?([^'\"\s]+)", text)
            return {"listen": top.group(1) if top else None, "admin": {"listen": admin.group(1) if admin else None}}
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            return {}
        return data if isinstance(data, dict) else {}

    # --- commands ------------------------------------------------------------------------------------

    def run(self, argv: list) -> tuple:
        """(rc, stdout + stderr) of argv; rc 127 when the command is missing, 124 past the deadline."""
        if shutil.which(argv[0]) is None:
            return 127, f"{argv[0]}: command not found"
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            return 124, f"no answer within {self.timeout:g}s"
        except OSError as exc:
            return 126, str(exc)
        return done.returncode, done.stdout.decode("utf-8", "replace")

    def unit_states(self, units: list) -> dict:
        """unit -> systemctl is-active's word (active, inactive, failed, activating, ...)."""
        if not units:
            return {}
        rc, out = self.run(["systemctl", "is-active", *units])
        lines = out.splitlines()
        if rc == 127 or len(lines) != len(units):
            why = " ".join(out.split())[-120:] or "no answer"
            return {unit: f"unknown ({why})" for unit in units}
        return dict(zip(units, (line.strip() for line in lines)))

    def image(self, ref: str) -> tuple:
        """(image id, labels) of a loaded image, or (None, docker's error); asked once per run."""
        cache = self.facts.setdefault("images", {})
        if ref not in cache:
            rc, out = self.run(["docker", "image", "inspect", ref])
            try:
                found = json.loads(out)[0] if rc == 0 else None
            except (ValueError, IndexError):
                found = None
            cache[ref] = ((found.get("Id"), (found.get("Config") or {}).get("Labels") or {}) if found
                          else (None, " ".join(out.split())[-160:]))
        return cache[ref]

    def dangling_images(self) -> list | None:
        """The full IDs of the images no tag names (what `docker image prune` deletes); None when Docker does not
        answer."""
        rc, out = self.run(["docker", "image", "ls", "--filter", "dangling=true", "--no-trunc", "--quiet"])
        if rc != 0:
            return None
        return sorted({line.strip() for line in out.splitlines() if line.strip().startswith("sha256:")})

    def hy_smi(self) -> str | None:
        """hy-smi under the hyhal directory (/opt/hyhal links to /usr/local/hyhal on real hosts)."""
        path = self.path("hyhal", "bin", "hy-smi")
        return path if os.access(path, os.X_OK) else None


def parse_env(text: str) -> dict:
    """A systemd EnvironmentFile as dcu_vllm writes it: NAME=value lines, comments, no quoting of values."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            env[name.strip()] = value.strip()
    return env


def gib(count: float) -> str:
    return f"{count / 1024 ** 3:.1f} GiB"
