"""dcu-exporter served for real: a fake hy-smi printing the field samples, a fake sysfs in a real host's layout,
scraped over HTTP and read with prometheus_client's parser."""

from __future__ import annotations

import argparse
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from exporter.exportertools import scrape
from modules.sysfs import BW_BDFS, make_sysfs

from dcu_serving import hysmi
from dcu_serving.exporter.cli import listen_address
from support import REPO, ServerProcess, free_port, python_module

MIB = 1024 * 1024
HCU_SAMPLE = "json_hcu_card0_mib.txt"  # a log line, then 3 x K100_AI at 04:00.0, 05:00.0, 83:00.0 (hy-smi's order)
# The same three cards as the driver registered them: the DRM (sysfs) order is not hy-smi's.
HCU_DRM_ORDER = ["0000:83:00.0", "0000:04:00.0", "0000:05:00.0"]


def hcu_host(tmp_path, **kwargs):
    return make_sysfs(tmp_path / "sys", cards=3, bdfs=HCU_DRM_ORDER, module=("hycu", "6.3.30-V1.4.1a"),
                      platform=True, **kwargs)


def test_each_card_is_labelled_by_hy_smi_index_and_pci_address_with_its_service(tmp_path, fake_hy_smi, exporter):
    services = tmp_path / "services.json"
    services.write_text(json.dumps({"0": "vllm@0", "1": "vllm@1", "0000:83:00.0": "embedding@2"}))
    url = exporter(fake_hy_smi(json_samples=[HCU_SAMPLE]), hcu_host(tmp_path), "--services", str(services))

    metrics = scrape(url)

    assert metrics.series("dcu_card_health") == {
        ("0", "0000:04:00.0", "vllm@0"): 1, ("1", "0000:05:00.0", "vllm@1"): 1, ("2", "0000:83:00.0", "embedding@2"): 1}
    assert metrics.series("dcu_card_temperature_celsius")[("1", "0000:05:00.0", "vllm@1")] == 61
    assert metrics.by_pci("dcu_card_utilization_percent") == {"0000:04:00.0": 0, "0000:05:00.0": 27.5,
                                                              "0000:83:00.0": 0}
    assert metrics.by_pci("dcu_card_vram_used_bytes")["0000:05:00.0"] == 20413 * MIB
    assert metrics.by_pci("dcu_card_vram_total_bytes")["0000:05:00.0"] == 65520 * MIB
    assert metrics.by_pci("dcu_card_power_watts") == {"0000:04:00.0": 114, "0000:05:00.0": 109, "0000:83:00.0": 112}
    assert metrics.value("dcu_cards") == 3, "the CPU's own 0x1d94 functions and the VGA are not cards"
    assert metrics.value("dcu_exporter_scrape_errors_total") == 0
    assert metrics.value("dcu_exporter_hysmi_seconds") > 0


def test_refused_json_falls_back_to_text_on_a_bw_box_out_of_pci_order(tmp_path, fake_hy_smi, exporter):
    hy_smi = fake_hy_smi(json_samples=None, text_sample="showbus_bw1100.txt")
    sysfs = make_sysfs(tmp_path / "sys", bdfs=sorted(BW_BDFS), module=("hycu", ""), drm_base=0)
    url = exporter(hy_smi, sysfs, "--min-interval", "0")

    metrics = scrape(url)

    health = metrics.series("dcu_card_health")
    assert sorted(health, key=lambda labels: int(labels[0])) == [(str(i), bdf, "") for i, bdf in enumerate(BW_BDFS)]
    assert set(health.values()) == {1}
    assert metrics.series("dcu_card_temperature_celsius") == {}, "hy-smi gave no temperature: none, not 0"
    scrape(url)
    flags = " ".join(hysmi.METRIC_FLAGS)
    assert hy_smi.calls() == [f"{flags} --json", flags, flags], "once refused, the text form is asked first"


def test_json_with_missing_commas_and_one_object_per_field_group(tmp_path, fake_hy_smi, exporter):
    hy_smi = fake_hy_smi(json_samples=["json_bw_pci_oam.txt", "json_bw_missing_commas.txt"])
    sysfs = make_sysfs(tmp_path / "sys", cards=2, bdfs=["0000:09:00.0", "0000:36:00.0"], module=("hycu", ""))

    metrics = scrape(exporter(hy_smi, sysfs))

    assert metrics.by_pci("dcu_card_power_watts") == {"0000:09:00.0": 91, "0000:36:00.0": 84}
    assert metrics.by_pci("dcu_card_temperature_celsius") == {"0000:09:00.0": 57, "0000:36:00.0": 54}
    assert metrics.by_pci("dcu_card_health") == {"0000:09:00.0": 1, "0000:36:00.0": 1}


def test_hymgr_down_serves_health_0_counts_the_error_and_says_why(tmp_path, fake_hy_smi, exporter, caplog):
    hy_smi = fake_hy_smi(json_samples=[HCU_SAMPLE])
    url = exporter(hy_smi, hcu_host(tmp_path), "--min-interval", "0")
    before = scrape(url)
    caplog.set_level(logging.WARNING, logger="dcu_exporter")

    hy_smi.stop_hymgr()
    down = scrape(url)

    assert set(down.series("dcu_card_health")) == set(before.series("dcu_card_health")), \
        "the cards keep hy-smi's index while it fails"
    assert set(down.series("dcu_card_health").values()) == {0}
    assert down.value("dcu_cards") == 3
    assert down.series("dcu_card_temperature_celsius") == {}, "no stale readings"
    assert down.value("dcu_exporter_scrape_errors_total") == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "json and text: exited 1: Connect server failed" in warning, "one cause, said once"
    assert "systemctl start hymgr" in warning, "hysmi.explain_failure's fix"
    scrape(url)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1, "logged once, not per scrape"

    hy_smi.start_hymgr()
    again = scrape(url)
    assert set(again.series("dcu_card_health").values()) == {1}
    assert again.value("dcu_exporter_scrape_errors_total") == 2, "a counter: the errors stay counted"


def test_started_while_hymgr_is_down_the_cards_come_from_sysfs_in_drm_order(tmp_path, fake_hy_smi, exporter):
    hy_smi = fake_hy_smi(json_samples=[HCU_SAMPLE])
    hy_smi.stop_hymgr()

    metrics = scrape(exporter(hy_smi, hcu_host(tmp_path)))

    assert metrics.series("dcu_card_health") == {(str(i), bdf, ""): 0 for i, bdf in enumerate(HCU_DRM_ORDER)}
    assert metrics.value("dcu_exporter_scrape_errors_total") == 1


def test_without_hy_smi_the_error_names_the_path(tmp_path, exporter, caplog):
    missing = tmp_path / "opt" / "hyhal" / "bin" / "hy-smi"
    metrics = scrape(exporter(missing, hcu_host(tmp_path)))
    assert set(metrics.series("dcu_card_health").values()) == {0}
    assert metrics.value("dcu_exporter_scrape_errors_total") == 1
    assert any(str(missing) in r.getMessage() and "No such file" in r.getMessage() for r in caplog.records)


def test_a_card_the_driver_does_not_bind_is_unhealthy(tmp_path, fake_hy_smi, exporter):
    sysfs = hcu_host(tmp_path)
    (sysfs / "bus" / "pci" / "devices" / "0000:05:00.0" / "driver").unlink()  # dropped by the driver
    metrics = scrape(exporter(fake_hy_smi(json_samples=[HCU_SAMPLE]), sysfs))
    assert metrics.by_pci("dcu_card_health") == {"0000:04:00.0": 1, "0000:05:00.0": 0, "0000:83:00.0": 1}

    not_loaded = make_sysfs(tmp_path / "sys-not-loaded", cards=2, drm=False)  # no driver, no DRM nodes
    hy_smi = fake_hy_smi(json_samples=[HCU_SAMPLE])
    hy_smi.stop_hymgr()
    metrics = scrape(exporter(hy_smi, not_loaded))
    assert metrics.series("dcu_card_health") == {("", "0000:04:00.0", ""): 0, ("", "0000:05:00.0", ""): 0}, \
        "a card down is reported, without an index hy-smi never gave"
    assert metrics.value("dcu_cards") == 2


def test_scrapes_within_min_interval_run_hy_smi_once(tmp_path, fake_hy_smi, exporter):
    hy_smi = fake_hy_smi(json_samples=[HCU_SAMPLE])
    url = exporter(hy_smi, hcu_host(tmp_path), "--min-interval", "60")
    assert hy_smi.calls() == [], "registering the collector does not run hy-smi"

    with ThreadPoolExecutor(4) as pool:
        scrapes = list(pool.map(lambda _: scrape(url), range(4)))
    scrapes.append(scrape(url))

    assert len(hy_smi.calls()) == 1
    assert all(s.by_pci("dcu_card_power_watts") == scrapes[0].by_pci("dcu_card_power_watts") for s in scrapes)


def test_services_file_absent_or_broken(tmp_path, fake_hy_smi, exporter):
    services = tmp_path / "services.json"
    url = exporter(fake_hy_smi(json_samples=[HCU_SAMPLE]), hcu_host(tmp_path), "--services", str(services),
                   "--min-interval", "0")
    absent = scrape(url)
    assert {labels[2] for labels in absent.series("dcu_card_health")} == {""}
    assert absent.value("dcu_exporter_scrape_errors_total") == 0, "not written yet is not an error"

    services.write_text('{"0": "vllm@0",')  # half written by hand
    broken = scrape(url)
    assert {labels[2] for labels in broken.series("dcu_card_health")} == {""}
    assert broken.value("dcu_exporter_scrape_errors_total") == 1

    services.write_text(json.dumps({"0": ["chat", "vision"]}))  # a card two services share
    assert scrape(url).series("dcu_card_health")[("0", "0000:04:00.0", "chat,vision")] == 1


@pytest.mark.parametrize(("text", "address"), [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)), (":9400", ("0.0.0.0", 9400)), ("[::1]:9400", ("::1", 9400))])
def test_listen_address(text, address):
    assert listen_address(text) == address


@pytest.mark.parametrize("text", ["9400", "host:", "host:http", "host:70000"])
def test_listen_address_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        listen_address(text)


def test_the_command_serves_until_terminated(tmp_path, fake_hy_smi):
    port = free_port()
    server = ServerProcess(
        python_module("dcu_serving.exporter", "--listen", f"127.0.0.1:{port}", "--hy-smi",
                      str(fake_hy_smi(json_samples=[HCU_SAMPLE]).path), "--sysfs-root", str(hcu_host(tmp_path))),
        port, env={"PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])},
        log=tmp_path / "exporter.log")
    try:
        server.start(ready_path="/metrics")
        assert scrape(f"{server.url}/metrics").value("dcu_cards") == 3
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.tail()
    assert f"serving card metrics on http://127.0.0.1:{port}/metrics" in server.tail()
