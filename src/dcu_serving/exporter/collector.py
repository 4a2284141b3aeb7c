"""Card metrics read at scrape time: hy-smi's readings joined to sysfs's cards by PCI address."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dcu_serving import hysmi

log = logging.getLogger("dcu_exporter")

CARD_LABELS = ("card", "pci", "service")
# (metric, help, key of hysmi.smi_readings()): a reading hy-smi did not give is left out, never exported as 0.
READINGS = (
    ("dcu_card_utilization_percent", "Compute use of the card in percent, hy-smi's HCU%/DCU%.", "use_percent"),
    ("dcu_card_vram_used_bytes", "VRAM in use.", "vram_used_bytes"),
    ("dcu_card_vram_total_bytes", "VRAM of the card.", "vram_total_bytes"),
    ("dcu_card_temperature_celsius", "Junction temperature (the edge sensor's where no junction sensor reports).",
     "temperature_c"),
    ("dcu_card_power_watts", "Average graphics package power.", "power_w"),
)
HEALTH_HELP = "1 when hy-smi reports the card and sysfs shows it bound to the DCU driver (hycu/hydcu), else 0."


class HySmiFailed(Exception):
    """hy-smi gave no readings; the message says why, with the fix when hysmi.explain_failure knows it."""


class HySmi:
    """hy-smi asked for hysmi.METRIC_FLAGS, as JSON first and as text when the JSON is refused or unreadable.

    The form that answered is asked first next time, so a healthy host runs hy-smi once per reading.
    """

    def __init__(self, path: str, timeout: float):
        self.path, self.timeout = path, timeout
        self._forms = ["json", "text"]

    def readings(self) -> list[dict]:
        failures = {}  # form -> what went wrong
        for form in list(self._forms):
            command = [self.path, *hysmi.METRIC_FLAGS, *(["--json"] if form == "json" else [])]
            try:
                proc = subprocess.run(command, capture_output=True, text=True, errors="replace",
                                      timeout=self.timeout, check=False)
            except subprocess.TimeoutExpired:
                # hy-smi blocks while hymgr does not answer: the other form would only wait as long again.
                failures[form] = f"no answer within {self.timeout:g}s"
                break
            except OSError as e:
                failures[form] = str(e)
                break
            if proc.returncode != 0:
                failures[form] = _exit_failure(proc.returncode, proc.stderr + "\n" + proc.stdout)
                continue
            parse = hysmi.parse_fields_json if form == "json" else hysmi.parse_fields_text
            try:
                readings = hysmi.smi_readings(parse(proc.stdout))
            except hysmi.HySmiParseError as e:
                failures[form] = str(e)
                continue
            if not any(reading["pci_bus"] for reading in readings):
                failures[form] = "no PCI addresses in the output, so its cards cannot be matched to sysfs"
                continue
            self._forms.remove(form)
            self._forms.insert(0, form)
            return readings
        raise HySmiFailed(self._summary(failures))

    def _summary(self, failures: dict[str, str]) -> str:
        """'hy-smi --showbus ...: json and text: exited 1: Connect server failed (the fix)': one line per cause."""
        forms_by_failure: dict[str, list[str]] = {}
        for form, failure in failures.items():
            forms_by_failure.setdefault(failure, []).append(form)
        causes = "; ".join(f"{' and '.join(forms)}: {failure}" for failure, forms in forms_by_failure.items())
        return f"{self.path} {' '.join(hysmi.METRIC_FLAGS)}: {causes}"


def _exit_failure(returncode: int, output: str) -> str:
    text = output.strip()
    hint = hysmi.explain_failure(text)
    return f"exited {returncode}: {text[-300:]}" + (f" ({hint})" if hint else "")


@dataclass
class Card:
    index: str  # hy-smi's index; "" for an unbound card hy-smi never listed
    pci: str
    service: str
    healthy: bool
    readings: dict = field(default_factory=dict)


@dataclass
class Snapshot:
    cards: list[Card]
    hysmi_seconds: float
    errors: int
    taken: float


class CardCollector:
    """A prometheus_client collector: each scrape gets the cards as read at most `min_interval` seconds ago.

    Concurrent scrapes wait for the one reading in progress instead of starting hy-smi again. A failed
    reading does not raise: the cards sysfs knows are served with health 0, the error counter goes up and
    the reason is logged once (again when it changes).
    """

    def __init__(self, hy_smi: HySmi, sysfs_root: str = "/sys", services_file: str | None = None,
                 min_interval: float = 5.0):
        self.hy_smi, self.sysfs_root = hy_smi, sysfs_root
        self.services_file, self.min_interval = services_file, min_interval
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._errors = 0
        # hy-smi's last answer: while it fails, known cards keep their index, so their series continue.
        self._index_by_pci: dict[str, int] = {}
        self._last_failure: str | None = None
        self._last_problems: list[str] = []
        self._last_services_error: str | None = None

    def describe(self):
        # Names only: registering the collector must not run hy-smi.
        return _families(Snapshot([], 0.0, 0, 0.0))

    def collect(self):
        return _families(self.snapshot())

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._snapshot is None or time.monotonic() - self._snapshot.taken >= self.min_interval:
                self._snapshot = self._read()
            return self._snapshot

    def _read(self) -> Snapshot:
        started = time.monotonic()
        try:
            readings, failure = self.hy_smi.readings(), None
        except HySmiFailed as e:
            readings, failure = None, str(e)
        hysmi_seconds = time.monotonic() - started
        self._note_failure(failure)
        services = self._services()
        cards = self._cards(hysmi.pci_functions(self.sysfs_root), readings)
        for card in cards:
            card.service = services.get(card.index) or services.get(card.pci) or ""
        return Snapshot(cards, hysmi_seconds, self._errors, time.monotonic())

    def _cards(self, functions: list[dict], readings: list[dict] | None) -> list[Card]:
        if readings is not None:
            self._index_by_pci = {r["pci_bus"]: r["index"] for r in readings if r["pci_bus"]}
            rows = readings
        else:
            rows = [{"index": index, "pci_bus": pci} for pci, index in self._index_by_pci.items()] or None
        # merge() gives sysfs's bound cards hy-smi's index, matched by address; those hy-smi missed come after.
        merged, problems = hysmi.merge(functions, rows)
        if readings is not None:
            self._note_problems(problems)
        reading_by_pci = {r["pci_bus"]: r for r in readings or () if r["pci_bus"]}
        cards = []
        for card in merged:
            reading = reading_by_pci.pop(card["pci_bus"], None)
            healthy = reading is not None and card["driver"] in hysmi.DRIVER_MODULES
            cards.append(Card(str(card["index"]), card["pci_bus"], "", healthy, reading or {}))
        # A card the driver does not bind (not loaded, or dropped it) is a card down, not a card gone.
        for function in functions:
            if function["kind"] == "unbound":
                reading = reading_by_pci.pop(function["pci_bus"], None)
                index = reading["index"] if reading else self._index_by_pci.get(function["pci_bus"])
                cards.append(Card("" if index is None else str(index), function["pci_bus"], "", False, reading or {}))
        # Rows sysfs does not show as DCUs (merge() named them): their readings are real, their health is not.
        cards += [Card(str(r["index"]), pci, "", False, r) for pci, r in reading_by_pci.items()]
        return cards

    def _services(self) -> dict[str, str]:
        """The services file: {"<card index or PCI address>": "<unit or service>"}; {} when absent."""
        if not self.services_file:
            return {}
        error = None
        try:
            services = json.loads(Path(self.services_file).read_text())
            if not isinstance(services, dict):
                error = f"{self.services_file}: not a JSON object"
        except FileNotFoundError:
            services = {}  # not written (yet): every service label is empty
        except (OSError, ValueError) as e:
            error = f"{self.services_file}: {e}"
        if error:
            self._errors += 1
            if error != self._last_services_error:
                log.warning("service labels left empty: %s", error)
        self._last_services_error = error
        if error:
            return {}
        return {str(key): ",".join(value) if isinstance(value, list) else str(value)
                for key, value in services.items()}

    def _note_failure(self, failure: str | None):
        if failure:
            self._errors += 1
            if failure != self._last_failure:
                log.warning("hy-smi gave no readings, cards are reported unhealthy until it answers: %s", failure)
        elif self._last_failure:
            log.info("hy-smi answers again")
        self._last_failure = failure

    def _note_problems(self, problems: list[str]):
        if problems != self._last_problems:
            for problem in problems:
                log.warning("%s", problem)
        self._last_problems = problems


def _families(snapshot: Snapshot):
    health = GaugeMetricFamily("dcu_card_health", HEALTH_HELP, labels=CARD_LABELS)
    readings = {name: GaugeMetricFamily(name, text, labels=CARD_LABELS) for name, text, _key in READINGS}
    for card in snapshot.cards:
        labels = [card.index, card.pci, card.service]
        health.add_metric(labels, 1 if card.healthy else 0)
        for name, _text, key in READINGS:
            if card.readings.get(key) is not None:
                readings[name].add_metric(labels, card.readings[key])
    return [
        health, *readings.values(),
        GaugeMetricFamily("dcu_cards", "Cards known: sysfs's DCUs, bound or not, and any other that hy-smi lists.",
                          value=len(snapshot.cards)),
        CounterMetricFamily("dcu_exporter_scrape_errors", "Readings that failed: hy-smi, or the services file.",
                            value=snapshot.errors),
        GaugeMetricFamily("dcu_exporter_hysmi_seconds", "Seconds hy-smi took for the last reading, failed or not.",
                          value=snapshot.hysmi_seconds),
    ]
