"""Every container the roles start passes the engine's own options through one filter (container_run_flags:
`--pull=never` only from Docker 20.10 on, `label=disable` under SELinux), never a spelling of its own: Kylin V10's
docker-engine 18.09 refuses `--pull` ("unknown flag: --pull", docs/field-evidence.md), so one hard-coded flag keeps
a whole service from starting there. The data roles (Milvus, etcd, MinerU) once did."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROLE_FILES = sorted(p for p in (REPO / "roles").glob("*/*/*") if p.suffix in (".j2", ".yml") and p.is_file())


def _code(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of what is not a comment."""
    return [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if not line.lstrip().startswith("#")]


def test_no_role_spells_pull_itself():
    spelled = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in ROLE_FILES for n, line in _code(p)
               if re.search(r"--pull\b", line)]
    fix = "pass ansible_facts.dcu_host | dcu.serving.container_run_flags instead:\n"
    assert spelled == [], fix + "\n".join(spelled)


def test_every_container_a_role_runs_takes_the_hosts_run_flags():
    runs = [p for p in ROLE_FILES if any(re.search(r"\brun[\"',]* +(--rm|-d)\b|'run', '--rm'", line)
                                         for _, line in _code(p))]
    assert len(runs) >= 6, [str(p.relative_to(REPO)) for p in runs]  # vllm, proxy, exporter, milvus, etcd, mineru...
    missing = [str(p.relative_to(REPO)) for p in runs if "container_run_flags" not in p.read_text()]
    assert missing == []
