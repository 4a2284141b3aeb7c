"""dcu-exporter's test tools: a fake hy-smi that prints the field samples, and scrapes parsed by prometheus_client."""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SAMPLES = Path(__file__).resolve().parent.parent / "modules" / "samples"


@dataclass
class FakeHySmi:
    """An executable hy-smi (make_fake_hy_smi) that appends each call's arguments to `calls_log` and says
    "Connect server failed" while `hymgr_down_flag` exists, as hy-smi does while its daemon is down."""

    path: Path
    calls_log: Path
    hymgr_down_flag: Path

    def calls(self) -> list[str]:
        return self.calls_log.read_text().splitlines() if self.calls_log.exists() else []

    def stop_hymgr(self):
        self.hymgr_down_flag.touch()

    def start_hymgr(self):
        self.hymgr_down_flag.unlink()


def make_fake_hy_smi(directory: Path, json_samples: list[str] | None = None,
                     text_sample: str | None = None) -> FakeHySmi:
    """hy-smi in `directory`: with --json it prints the json_samples one after the other (None: refuses, as
    rocm-smi refuses JSON without field flags), else text_sample; samples of tests/modules/samples, whose
    sources docs/field-evidence.md names."""
    directory.mkdir()
    outputs = directory / "outputs.json"
    outputs.write_text(json.dumps({
        "json": "".join((SAMPLES / name).read_text() for name in json_samples) if json_samples else None,
        "text": (SAMPLES / text_sample).read_text() if text_sample else "",
        "refused": (SAMPLES / "concise_json_refused.txt").read_text(),
    }))
    fake = FakeHySmi(directory / "hy-smi", directory / "calls.log", directory / "hymgr-down")
    fake.path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(fake.calls_log)!r}, 'a') as log:\n"
        "    log.write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"if os.path.exists({str(fake.hymgr_down_flag)!r}):\n"
        "    print('Connect server failed', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        f"outputs = json.load(open({str(outputs)!r}))\n"
        "if '--json' not in sys.argv:\n"
        "    sys.stdout.write(outputs['text'])\n"
        "elif outputs['json'] is None:\n"
        "    sys.stdout.write(outputs['refused'])\n"
        "    sys.exit(1)\n"
        "else:\n"
        "    sys.stdout.write(outputs['json'])\n"
    )
    fake.path.chmod(0o755)
    return fake


class Scrape:
    """One scrape's samples, parsed with prometheus_client's own parser."""

    def __init__(self, text: str):
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def series(self, name: str) -> dict[tuple, float]:
        """{(card, pci, service): value} of a per-card metric."""
        return {(s.labels["card"], s.labels["pci"], s.labels["service"]): s.value
                for s in self.samples if s.name == name}

    def by_pci(self, name: str) -> dict[str, float]:
        return {s.labels["pci"]: s.value for s in self.samples if s.name == name}

    def value(self, name: str) -> float:
        [value] = [s.value for s in self.samples if s.name == name]
        return value


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=15) as response:
        assert response.status == 200
        return Scrape(response.read().decode())
