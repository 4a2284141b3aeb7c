"""The lists the roles and playbooks used to build with Jinja loops ({% set out = [] %}...append), now filters over
plugin_utils: the gateway's secrets' problems, keys file and probes, config_files' entries, a user's groups, the
exporter's card labels, the image inspects of one host_probe call, the bundle build's changes."""

from __future__ import annotations

import hashlib

from ansible_collections.dcu.serving.plugins.module_utils.gateway_config import gateway_config
from ansible_collections.dcu.serving.plugins.plugin_utils.bundle_stage import bundle_changes
from ansible_collections.dcu.serving.plugins.plugin_utils.containers import (
    image_inspect_commands,
    image_inspect_results,
    vllm_images,
)
from ansible_collections.dcu.serving.plugins.plugin_utils.gateway import (
    caller_keys,
    caller_problems,
    deployment_ids,
    probe_results,
)
from ansible_collections.dcu.serving.plugins.plugin_utils.host_files import (
    directory_entries,
    env_file_entries,
    member_groups,
    previous_files,
)
from ansible_collections.dcu.serving.plugins.plugin_utils.topology import exporter_card_units, facts_by_host

KEY = "sk-fleet-app-test-0123456789abcdef"


def test_good_secrets_have_no_problem():
    assert caller_problems("m" * 16, [{"alias": "app", "key": KEY, "rpm": 60}, {"alias": "ops", "key": KEY}]) == []


def test_each_secret_problem_names_the_caller_by_position_and_alias_never_by_key():
    problems = caller_problems("short", [
        {"alias": "app", "key": "sk-too-short"},
        {"key": KEY},
        "app",
        {"alias": "app", "key": KEY, "rpm": 0, "concurrent": "lots"},
    ])
    assert problems == [
        "dcu_gateway_master_key: missing or shorter than 16 characters; put a long random one in ansible-vault "
        "(ansible-vault encrypt_string) or the environment (lookup('env', ...))",
        "dcu_gateway_callers[0] (app): needs alias and a key of 16 characters or more",
        "dcu_gateway_callers[1] (no alias): needs alias and a key of 16 characters or more",
        "dcu_gateway_callers[2] (not a mapping): needs alias and a key of 16 characters or more",
        "dcu_gateway_callers[3].rpm: 0; a whole number >= 1, or leave it out for no limit",
        "dcu_gateway_callers[3].concurrent: lots; a whole number >= 1, or leave it out for no limit",
        "dcu_gateway_callers: each alias once (the alias names the caller in every results log)",
    ]
    assert not any("sk-too-short" in p or KEY in p for p in problems)
    assert caller_problems(None, [])[1] == ("dcu_gateway_callers: empty; give each calling system {alias, key, rpm?, "
                                            "concurrent?}")


def test_the_keys_file_holds_each_keys_sum_not_the_key():
    assert caller_keys([{"alias": "app", "key": KEY, "concurrent": 16}]) == [
        {"alias": "app", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "rpm": None, "concurrent": 16}]


def test_deployments_and_what_their_probes_found():
    hosts = [{"name": "node-a", "url": "http://10.0.0.11:8000", "models": ["m", "bge"]},
             {"name": "node-b", "url": "http://10.0.0.12:9000", "models": ["m"]}]
    assert deployment_ids(gateway_config(hosts)) == ["node-a/m", "node-a/bge", "node-b/m"]
    assert deployment_ids({}) == []
    trace = "Connection refused" + " x" * 200 + " stack trace: Traceback ..."
    results = [
        {"__dcu_gateway_id": "node-a/m", "json": {"healthy_count": 1}},
        {"__dcu_gateway_id": "node-a/m", "json": {"healthy_count": 0, "unhealthy_endpoints": [{"error": trace}]}},
        {"__dcu_gateway_id": "node-b/m", "msg": "Status code was -1: timed out", "status": -1},
        {"__dcu_gateway_id": "node-a/bge", "json": {"healthy_count": 2}},
    ]
    probes = probe_results(results)
    assert [(p["host"], p["model"], p["sent"], p["answered"]) for p in probes] == [
        ("node-a", "m", 2, 1), ("node-b", "m", 1, 0), ("node-a", "bge", 1, 1)]
    assert probes[0]["error"].startswith("Connection refused x x") and probes[0]["error"].endswith("...")
    assert len(probes[0]["error"]) <= 300 and "stack trace" not in probes[0]["error"]
    assert probes[1]["error"] == "Status code was -1: timed out" and probes[2]["error"] is None


def test_config_files_entries_and_a_rollback_of_what_changed():
    assert directory_entries(["/srv/b", "/srv/b/images"]) == [
        {"path": "/srv/b", "owner": "root", "group": "root", "mode": "0755"},
        {"path": "/srv/b/images", "owner": "root", "group": "root", "mode": "0755"}]
    files = env_file_entries([{"name": "0"}, {"name": "chat-0"}], "/etc/dcu-serving/vllm",
                             {"0": "DCU_VLLM_PORT=8002\n", "chat-0": "DCU_VLLM_PORT=8100\n"})
    assert [(f["path"], f["content"], f["mode"], f["return_previous"]) for f in files] == [
        ("/etc/dcu-serving/vllm/0.env", "DCU_VLLM_PORT=8002\n", "0644", True),
        ("/etc/dcu-serving/vllm/chat-0.env", "DCU_VLLM_PORT=8100\n", "0644", True)]
    written = {"files": {
        "/etc/dcu-serving/vllm/0.env": {"content_changed": True, "previous": "DCU_VLLM_PORT=8000\n"},
        "/etc/dcu-serving/vllm/chat-0.env": {"content_changed": True},  # new: nothing to put back
    }}
    assert previous_files(files, written) == [dict(files[0], content="DCU_VLLM_PORT=8000\n", return_previous=False)]
    assert previous_files(files, {"files": {}}) == []


def test_a_users_groups_are_its_memberships_and_its_primary_group():
    group = {"render": ["x", "992", "dcu-serving,other"], "video": ["x", "44", ""], "dcu-serving": ["x", "998", ""],
             "adm": ["x", "4", "syslog"]}
    passwd = {"dcu-serving": ["x", "998", "998", "", "/nonexistent", "/usr/sbin/nologin"]}
    assert member_groups("dcu-serving", group, passwd) == ["render", "dcu-serving"]


def test_each_card_is_labelled_with_the_unit_on_it_and_one_fact_per_host():
    instances = [{"unit": "vllm@chat-0", "cards": [0, 1]}, {"unit": "vllm@2", "card": 2}]
    assert exporter_card_units(instances) == {"0": "vllm@chat-0", "1": "vllm@chat-0", "2": "vllm@2"}
    hostvars = {"node-a": {"__verify_health": {"summary": "8/8"}}, "node-b": {}}
    assert facts_by_host(["node-a", "node-b"], hostvars, "__verify_health", {}) == {
        "node-a": {"summary": "8/8"}, "node-b": {}}


def test_one_inspect_per_image_in_one_host_probe_call_read_back_as_a_loop():
    instances = [{"image": "vllm:0.11"}, {"image": "vllm:0.11"}, {"image": "bge:1"}, {"image": ""}]
    commands = image_inspect_commands(instances, "/usr/bin/docker")
    assert commands == {"image vllm:0.11": ["/usr/bin/docker", "image", "inspect", "vllm:0.11"],
                        "image bge:1": ["/usr/bin/docker", "image", "inspect", "bge:1"]}
    answers = {"image vllm:0.11": {"rc": 0, "stdout": '[{"Id": "sha256:aa", "Config": {"Labels": '
                                                      '{"dcu-serving.dtk": "26.04"}}}]', "stderr": ""},
               "image bge:1": {"rc": 1, "stdout": "", "stderr": "Error: No such image: bge:1"},
               "systemd": {"rc": 0, "stdout": "systemd 252", "stderr": ""}}
    results = image_inspect_results(answers)
    assert [r["item"] for r in results] == ["bge:1", "vllm:0.11"]
    image = vllm_images(results)["vllm:0.11"]
    assert (image["id"], image["dtk"]) == ("sha256:aa", "26.04")


def test_the_bundle_builds_changes_one_line_each():
    outcomes = [{"action": "built", "size": 1536, "seconds": 2.25, "file": "wheels/a.whl"},
                {"action": "kept", "size": 10, "seconds": 0, "file": "b"}]
    assert bundle_changes(outcomes) == ["built         1.50 KB    2.2s  wheels/a.whl"]
