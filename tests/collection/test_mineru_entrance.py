"""MinerU's entrance as a play works it out: a real ansible-playbook run of dcu_proxy's and dcu_mineru's exports (as
serving.yml reads them before dcu_proxy writes proxy.yml) on a local host. `dcu_mineru_entrance: proxy` puts MinerU's
URL, upload limit, workers, queue and deadline into proxy.yml's `mineru` section; `own`, the default, leaves it out;
a bad value fails the play naming the variable and the fix."""

from __future__ import annotations

import sys
from pathlib import Path

from support import local_play

# dcu_proxy's and dcu_mineru's exports, as serving.yml reads them, and what they set
PLAY = [{"hosts": "dcu_nodes", "gather_facts": False, "tasks": [
    {"name": "Proxy exports", "ansible.builtin.include_role": {"name": "dcu.serving.dcu_proxy",
                                                              "tasks_from": "exports", "public": True}},
    {"name": "MinerU exports", "ansible.builtin.include_role": {"name": "dcu.serving.dcu_mineru",
                                                               "tasks_from": "exports"}},
    {"name": "Show", "ansible.builtin.debug": {"msg": {
        "section": "{{ __dcu_proxy_config_data.mineru | default('none') }}", "api_url": "{{ dcu_mineru_api_url }}"}}},
]}]


def run(tmp_path: Path, node: dict) -> tuple[int, str, list]:
    """(return code, whole output, the results of the play's tasks on the host)."""
    node = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False,
            "dcu_mineru_vlm_model": "MinerU2.5-2509-1.2B", **node}
    return local_play(tmp_path, {"all": {"children": {"dcu_nodes": {"hosts": {"node": node}}}}}, PLAY)


def test_the_entrance_puts_minerus_section_into_proxy_yml_only_when_the_inventory_says_proxy(tmp_path):
    code, out, results = run(tmp_path, {"dcu_mineru_entrance": "proxy", "dcu_mineru_max_upload_mb": 20,
                                        "dcu_mineru_workers": 3, "dcu_proxy_listen": "0.0.0.0:9000"})
    assert code == 0, out
    assert results[-1]["msg"] == {
        "section": {"url": "http://127.0.0.1:8010", "max_upload_mb": 20, "concurrency": 3, "queue_size": 16,
                    "timeout": 1800},
        "api_url": "http://127.0.0.1:9000/mineru"}

    code, out, results = run(tmp_path, {})
    assert code == 0, out
    assert results[-1]["msg"] == {"section": "none", "api_url": "http://127.0.0.1:8010"}


def test_a_bad_entrance_fails_the_play_naming_the_variable(tmp_path):
    code, out, results = run(tmp_path, {"dcu_mineru_entrance": "proxy", "dcu_mineru_listen": "0.0.0.0:8010"})
    assert code != 0 and results[-1]["failed"], out
    assert ("dcu_mineru_entrance is proxy but dcu_mineru_listen 0.0.0.0:8010 takes calls from the network"
            in results[-1]["msg"]), results[-1]
    assert "set dcu_mineru_listen to 127.0.0.1:8010, or dcu_mineru_entrance: own" in results[-1]["msg"]
    code, _, results = run(tmp_path, {"dcu_mineru_entrance": "gateway"})
    assert code != 0 and "dcu_mineru_entrance is 'gateway': choose own" in results[-1]["msg"], results[-1]
