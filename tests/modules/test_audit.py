"""The audit report: serving_audit reads the roles' records, the engine's images and the model directory on a
host in one call (a fake docker on the command line, real files); audit_report compares them with the bundle's
index.json and the inventory and lists the drift; audit_markdown prints it."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

from ansible_collections.dcu.serving.plugins.plugin_utils.audit import (
    audit_fleet,
    audit_gateway,
    audit_gateway_lines,
    audit_markdown,
    audit_report,
    write_gateway,
    write_reports,
)

DRIVER_SUM, DTK_SUM, IMAGE_SUM = "71" * 32, "68" * 32, "25" * 32
VLLM = "dcu-serving/vllm-sim:0.11.0"
DIGEST = "sha256:" + "4b" * 32
OLD_DIGEST = "sha256:" + "3a" * 32
BUNDLE = {"format": 1, "artifacts": [
    {"name": "rock", "kind": "driver", "version": "6.3.30-V1.4.1a", "file": "driver/rock-6.3.30-V1.4.1a.run",
     "sha256": DRIVER_SUM},
    {"name": "dtk", "kind": "dtk", "version": "26.04", "file": "dtk/DTK-26.04-Debian12-x86_64.tar.gz",
     "sha256": DTK_SUM},
    {"name": "vllm", "kind": "image", "version": "0.11.0", "file": "images/dcu-serving_vllm-sim_0.11.0.tar.gz",
     "sha256": IMAGE_SUM, "refs": [VLLM], "config_digest": DIGEST},
]}

# `docker inspect <images and containers>`: JSON for the names it holds, and an error (rc 1) for the others.
FAKE_ENGINE = """#!{python}
import json, sys
known = {known!r}
assert sys.argv[1] == "inspect", sys.argv
names = sys.argv[2:]
print(json.dumps([known[n] for n in names if n in known]))
missing = [n for n in names if n not in known]
if missing:
    sys.stderr.write("Error: No such object: %s\\n" % missing[0])
    sys.exit(1)
"""


@pytest.fixture
def host(tmp_path):
    """A converged host's files under tmp_path, and a fake engine that holds the vLLM image and runs vllm-0."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "rock-install.json").write_text(json.dumps({
        "file": "driver/rock-6.3.30-V1.4.1a.run", "sha256": DRIVER_SUM, "version": "6.3.30-V1.4.1a",
        "package": "rock-6.3.30-V1.4.1a", "how": "installed by dcu.serving.dcu_driver"}))
    (state / "dtk-install.json").write_text(json.dumps({
        "file": "dtk/DTK-26.04-Debian12-x86_64.tar.gz", "sha256": DTK_SUM, "version": "26.04",
        "dir": str(tmp_path / "dtk-26.04")}))
    (tmp_path / "dtk-26.04").mkdir()
    (tmp_path / "dtk").symlink_to(tmp_path / "dtk-26.04")
    (tmp_path / "hyhal" / "bin").mkdir(parents=True)
    model = tmp_path / "models" / "MiniCPM-V-4.5"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"architectures": ["MiniCPMV"]}')
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001.safetensors"}}')
    with open(model / "model-00001.safetensors", "wb") as weights:  # sparse: sized, never read
        weights.truncate(3 * 1024 ** 3)
    meta = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "dcu_serving-0.1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: dcu-serving\nVersion: 0.1.0\n")
    (tmp_path / "proxy.yml").write_text("listen: 0.0.0.0:8000\n")
    engine = tmp_path / "docker"
    engine.write_text(FAKE_ENGINE.format(python=sys.executable, known={
        VLLM: {"Id": DIGEST, "RepoTags": [VLLM]},
        "vllm-0": {"Name": "/vllm-0", "Image": DIGEST, "Config": {"Image": VLLM}, "State": {"Running": True}},
        # as vllm@.service starts it: by the image's ID, the tag in a label; the tag was re-released since
        "vllm-1": {"Name": "/vllm-1", "Image": OLD_DIGEST, "State": {"Running": True},
                   "Config": {"Image": OLD_DIGEST, "Labels": {"dcu-serving.image": VLLM, "vendor": "x"}}}}))
    engine.chmod(0o755)
    return tmp_path


def gather(module_runner, host, **extra):
    args = {"state_dir": str(host / "state"), "hyhal_dir": str(host / "hyhal"), "dtk_link": str(host / "dtk"),
            "engine": str(host / "docker"), "images": [VLLM, "dcu-serving/absent:1"],
            "containers": ["vllm-0", "vllm-9"], "model_dirs": [str(host / "models" / "MiniCPM-V-4.5")],
            "proxy_venv": str(host / "venv"), "proxy_config": str(host / "proxy.yml"), **extra}
    result = module_runner("serving_audit", args)
    assert not result.get("failed"), result
    return result


def test_serving_audit_reads_the_records_images_model_and_proxy(module_runner, host):
    got = gather(module_runner, host)
    assert got["changed"] is False
    assert got["driver"]["sha256"] == DRIVER_SUM and got["driver"]["file"] == "driver/rock-6.3.30-V1.4.1a.run"
    assert got["dtk"]["sha256"] == DTK_SUM and got["dtk"]["link"] == str(host / "dtk-26.04")
    assert got["hyhal"] == {"path": str(host / "hyhal"), "version": None, "marker": None}
    assert got["images"] == [{"ref": VLLM, "id": DIGEST}, {"ref": "dcu-serving/absent:1", "id": None}]
    assert got["containers"] == [{"name": "vllm-0", "image": VLLM, "image_id": DIGEST, "running": True},
                                 {"name": "vllm-9", "image": None, "image_id": None, "running": None}]
    model = got["models"][0]
    model_dir = host / "models" / "MiniCPM-V-4.5"
    config = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
    index = hashlib.sha256((model_dir / "model.safetensors.index.json").read_bytes()).hexdigest()
    assert (model["config_sha256"], model["index"], model["index_sha256"]) == (
        config, "model.safetensors.index.json", index)
    assert model["content_sha256"] == hashlib.sha256(
        f"{config}  config.json\n{index}  model.safetensors.index.json\n".encode()).hexdigest()
    assert model["files"] == 3 and model["size_bytes"] == 3 * 1024 ** 3 + sum(
        os.path.getsize(model_dir / n) for n in ("config.json", "model.safetensors.index.json"))
    assert got["proxy"] == {"version": "0.1.0", "config": str(host / "proxy.yml"),
                            "config_sha256": hashlib.sha256(b"listen: 0.0.0.0:8000\n").hexdigest()}


def test_a_host_with_nothing_installed_reads_as_nulls(module_runner, tmp_path):
    got = module_runner("serving_audit", {"state_dir": str(tmp_path), "hyhal_dir": str(tmp_path / "no"),
                                          "dtk_link": str(tmp_path / "no"), "engine": "no-such-engine",
                                          "images": [VLLM], "model_dirs": [str(tmp_path / "absent")],
                                          "proxy_venv": str(tmp_path), "proxy_config": str(tmp_path / "no.yml")})
    assert got["driver"] is None and got["dtk"] == {"link": None} and got["images"] == [{"ref": VLLM, "id": None}]
    assert got["models"][0]["exists"] is False and got["proxy"]["version"] is None


FACTS = {"card_count": 8, "source": "hy-smi-json", "driver": {"loaded": True, "module": "hycu",
                                                              "version": "6.3.30-V1.4.1a"},
         "dtk": {"path": "/opt/dtk", "version": "26.04"}}
HEALTH = {"healthy": 8, "total": 8, "summary": "8/8", "units": [
    {"unit": f"vllm@{card}", "state": "active", "active": "active", "sub": "running", "result": "success",
     "restarts": 0} for card in range(8)], "requests": [
    {"model": "MiniCPM-V-4.5", "api": "chat", "status": 200, "backend": "127.0.0.1:8005", "latency_s": 0.4}]}
EXPECTED = {"cards": 8, "driver_version": "", "dtk_version": "", "instances": 8}


def report(module_runner, host, **changes):
    args = {"facts": FACTS, "health": HEALTH, "access": [{"user": "dcu-serving", "problems": []}],
            "bundle": BUNDLE, "expected": EXPECTED, "orid": "verify-node-1", "generated": "2026-12-02T00:00:00Z",
            **changes}
    return audit_report(gather(module_runner, host, images=[VLLM], containers=["vllm-0"]), "node", **args)


def test_the_report_names_each_part_with_the_bundle_file_and_sum_it_came_from(module_runner, host):
    r = report(module_runner, host)
    assert r["ok"] and r["drift"] == [] and r["problems"] == [] and r["healthy"] == "8/8"
    assert (r["driver"]["file"], r["driver"]["sha256"], r["driver"]["in_bundle"]) == (
        "driver/rock-6.3.30-V1.4.1a.run", DRIVER_SUM, True)
    assert (r["dtk"]["version"], r["dtk"]["sha256"], r["dtk"]["active_version"]) == ("26.04", DTK_SUM, "26.04")
    assert r["hyhal"]["from"] == "the driver package" and r["hyhal"]["sha256"] == DRIVER_SUM
    assert r["images"] == [{"name": "vllm", "ref": VLLM, "config_digest": DIGEST,
                            "file": "images/dcu-serving_vllm-sim_0.11.0.tar.gz", "sha256": IMAGE_SUM}]
    md = audit_markdown(r)
    assert md.startswith("# Audit of node\n\n**OK** - 8/8 healthy")
    assert f"| driver | 6.3.30-V1.4.1a | driver/rock-6.3.30-V1.4.1a.run | {DRIVER_SUM} |" in md
    assert f"| {VLLM} | {DIGEST} | images/dcu-serving_vllm-sim_0.11.0.tar.gz | {IMAGE_SUM} |" in md


def test_the_report_names_each_instance_that_runs_code_from_its_model_directory(module_runner, host):
    instances = [{"unit": "vllm@vision-0", "model": "MiniCPM-V-4.5", "model_dir": "/srv/models/MiniCPM-V-4.5",
                  "trust_remote_code": True},
                 {"unit": "vllm@embed-0", "model": "bge-m3", "model_dir": "/srv/models/bge-m3",
                  "trust_remote_code": False}]
    r = report(module_runner, host, instances=instances)
    assert r["remote_code"] == [{"unit": "vllm@vision-0", "model": "MiniCPM-V-4.5",
                                 "model_dir": "/srv/models/MiniCPM-V-4.5"}]
    assert ("Code from the model directory (trust_remote_code): vllm@vision-0 runs MiniCPM-V-4.5's, "
            "/srv/models/MiniCPM-V-4.5.") in audit_markdown(r)
    assert "(trust_remote_code): none runs." in audit_markdown(report(module_runner, host))


def test_a_standalone_hyhal_is_reported_from_its_marker(module_runner, host):
    (host / "hyhal" / ".info").mkdir()
    (host / "hyhal" / ".info" / "version").write_text("6.3.31\n")
    (host / "hyhal" / ".dcu-serving-hyhal").write_text(f"hyhal/hyhal-6.3.31-x86_64.tar.gz sha256:{'ab' * 32}\n"
                                                       "over rock 6.3.30-V1.4.1a")
    hyhal = report(module_runner, host)["hyhal"]
    assert hyhal == {"path": str(host / "hyhal"), "version": "6.3.31", "file": "hyhal/hyhal-6.3.31-x86_64.tar.gz",
                     "sha256": "ab" * 32, "from": "standalone tarball"}


def test_drift_from_the_bundle_and_the_inventory_is_listed(module_runner, host):
    bundle = json.loads(json.dumps(BUNDLE))
    bundle["artifacts"][0]["sha256"] = "00" * 32      # the driver on the host is not the bundle's
    bundle["artifacts"][2]["config_digest"] = "sha256:" + "99" * 32  # nor is the image
    r = report(module_runner, host, bundle=bundle, facts=dict(FACTS, card_count=7),
               expected=dict(EXPECTED, dtk_version="25.04"))
    assert not r["ok"] and r["driver"]["in_bundle"] is False
    drift = "\n".join(r["drift"])
    assert "cards: 7 found, the inventory expects 8 (dcu_vllm_expected_cards)" in drift
    assert f"driver: installed from driver/rock-6.3.30-V1.4.1a.run (sha256 {DRIVER_SUM}), which the bundle does " \
           "not hold" in drift
    assert "dtk: 26.04 installed, the inventory pins 25.04 (dcu_driver_dtk_version)" in drift
    assert f"image {VLLM}: the engine holds {DIGEST}, the bundle's images/dcu-serving_vllm-sim_0.11.0.tar.gz is " \
           f"sha256:{'99' * 32}" in drift


def test_a_container_started_by_id_is_reported_by_its_tag_and_an_older_one_is_drift(module_runner, host):
    got = gather(module_runner, host, containers=["vllm-1"])
    assert got["containers"] == [{"name": "vllm-1", "image": VLLM, "image_id": OLD_DIGEST, "running": True}]
    r = report(module_runner, host)
    assert r["drift"] == []
    r = audit_report(gather(module_runner, host, images=[VLLM], containers=["vllm-0", "vllm-1"]), "node",
                     facts=FACTS, health=HEALTH, access=[], bundle=BUNDLE, expected=EXPECTED, orid="o",
                     generated="2026-12-02T00:00:00Z")
    assert r["drift"] == [f"container vllm-1 runs an older {VLLM} ({OLD_DIGEST}; the engine's is {DIGEST}) - "
                          "serving.yml restarts it on the loaded one"]


def test_failed_units_and_a_failed_check_are_problems(module_runner, host):
    units = [dict(u) for u in HEALTH["units"]]
    units[3].update(state="failed", active="activating", sub="auto-restart", restarts=1)
    health = {"failed": True, "msg": "1 of 9 units failed (after 0.4s): vllm@3 keeps failing", "units": units}
    r = report(module_runner, host, health=health)
    assert not r["ok"] and r["healthy"] == "0/8"
    assert r["problems"] == ["vllm@3 failed", "verify: 1 of 9 units failed (after 0.4s): vllm@3 keeps failing"]
    assert "| vllm@3 | failed | activating/auto-restart | 1 |" in audit_markdown(r)


def test_the_fleet_summary_counts_the_hosts_without_problems(module_runner, host):
    good = report(module_runner, host)
    bad = dict(good, host="node2", ok=False, problems=["vllm@3 failed"])
    fleet = audit_fleet([good, bad, None], generated="2026-12-02T00:00:00Z")
    assert (fleet["hosts"], fleet["ok"]) == (2, 1)
    assert fleet["summary"][1]["problems"] == ["vllm@3 failed"] and fleet["summary"][0]["images"] == {VLLM: DIGEST}
    md = audit_markdown(fleet)
    assert "1 of 2 hosts without problems or drift" in md and "| node2 | **no** | 8/8 |" in md


def test_a_host_whose_device_check_failed_is_reported_not_checked(module_runner, host):
    access = [{"item": "dcu-serving", "failed": True, "msg": "dcu-serving cannot open /dev/kfd: permission denied",
               "problems": []}]
    r = report(module_runner, host, health={}, access=access)
    assert not r["ok"] and r["healthy"] == "not checked"
    assert r["problems"] == ["device access of dcu-serving: dcu-serving cannot open /dev/kfd: permission denied"]
    assert r["device_access"] == [{"user": "dcu-serving", "ok": False, "problems": [
        "dcu-serving cannot open /dev/kfd: permission denied"]}]


def health(*models_healthy):
    """A cluster_health result whose backends serve these (model, healthy) pairs."""
    return {"backends": [{"url": f"http://127.0.0.1:{8002 + i}", "models": [m], "healthy": ok}
                         for i, (m, ok) in enumerate(models_healthy)]}


def test_the_gateway_part_is_n_of_n_per_host_and_model_and_names_what_it_cannot_reach():
    probes = [{"host": "node-a", "model": "chat", "sent": 2, "answered": 2, "error": None},
              {"host": "node-b", "model": "chat", "sent": 2, "answered": 0, "error": "Connection refused"},
              {"host": "node-b", "model": "embed", "sent": 2, "answered": 1, "error": "503"}]
    gw = audit_gateway(probes, "gateway", generated="2026-12-02T00:00:00Z",
                       health={"node-a": health(("chat", True), ("chat", True), ("embed", False)), "node-b": {}})
    assert not gw["ok"]
    assert [(d["host"], d["model"], d["reached"], d["ok"], d["healthy"]) for d in gw["deployments"]] == [
        ("node-a", "chat", "2/2", True, "2/2"), ("node-b", "chat", "0/2", False, None),
        ("node-b", "embed", "1/2", False, None)]
    assert gw["problems"] == ["the gateway does not reach node-b chat (Connection refused)",
                              "the gateway does not reach node-b embed (503)"]
    lines = audit_gateway_lines(gw)
    assert lines[0] == "gateway -> node-a chat: 2/2 through the gateway, 2/2 healthy behind its proxy"
    assert lines[1] == "gateway -> node-b chat: 0/2 through the gateway - NOT REACHED: Connection refused"
    assert audit_gateway([], "gateway")["ok"] is False  # nothing verified is not a pass


def test_a_host_left_drained_on_the_gateway_fails_although_its_health_answers():
    """/health?model_id= goes past routing: a drained host answers there while no caller reaches it."""
    probes = [{"host": "node-a", "model": "chat", "sent": 1, "answered": 1, "error": None},
              {"host": "node-b", "model": "chat", "sent": 1, "answered": 1, "error": None}]
    gw = audit_gateway(probes, "gw1", drained={"node-b": {"since": 1764655262.5, "reason": "rolling_restart.yml"}})
    assert not gw["ok"]
    assert [(d["host"], d["ok"], d["drained"]) for d in gw["deployments"]] == [
        ("node-a", True, None), ("node-b", False, "by rolling_restart.yml since 2025-12-02T06:01:02Z")]
    assert gw["problems"] == [
        "the gateway leaves node-b out of its rotation (drained by rolling_restart.yml since 2025-12-02T06:01:02Z): a "
        "play that failed left it so; once it serves, run serving.yml for it, or undrain it on the gateway "
        "(python -m dcu_serving.gateway.drained undrain node-b)"]
    assert audit_gateway_lines(gw)[1] == ("gw1 -> node-b chat: 1/1 through the gateway - DRAINED by "
                                          "rolling_restart.yml since 2025-12-02T06:01:02Z: no caller reaches it")
    assert audit_gateway(probes, "gw1", drained={})["ok"]


def test_the_fleet_report_carries_the_gateway_part_whichever_play_writes_it_last(module_runner, host, tmp_path):
    good = report(module_runner, host)
    probes = [{"host": good["host"], "model": "MiniCPM-V-4.5", "sent": 1, "answered": 1, "error": None}]
    gw = audit_gateway(probes, "gw1", generated="2026-12-02T00:00:00Z")
    assert gw["ok"]
    reports = tmp_path / "reports"
    write_reports(str(reports), good, [good["host"]])
    assert "gateway" not in json.loads((reports / "fleet.json").read_text())
    write_gateway(str(reports), gw)
    fleet = json.loads((reports / "fleet.json").read_text())
    assert fleet["hosts"] == 1 and fleet["gateway"]["deployments"][0]["reached"] == "1/1"
    md = (reports / "fleet.md").read_text()
    assert "## Through the gateway" in md and f"| {good['host']} | MiniCPM-V-4.5 | 1/1 |" in md
    write_reports(str(reports), good, [good["host"]])  # a host verified again keeps the gateway's part
    assert json.loads((reports / "fleet.json").read_text())["gateway"] == gw
