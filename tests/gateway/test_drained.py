"""Drained hosts (dcu_serving.gateway.drained): the file the plays write on the gateway, and the filter the gateway's
hook applies to LiteLLM's deployments before it routes. Plain Python: no LiteLLM needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from dcu_serving.gateway.drained import Drained, host_of, load, main, update, without


def deployment(host: str, model: str = "chat") -> dict:
    return {"model_name": model, "litellm_params": {"api_base": f"http://{host}:8000/v1"},
            "model_info": {"id": f"{host}/{model}"}}


def test_drain_and_undrain_are_recorded_and_report_whether_they_changed(tmp_path):
    file = str(tmp_path / "state" / "drained.json")
    assert load(file) == {}  # no file: nothing drained
    first = update(file, "node-a", True, "serving.yml")
    assert first["changed"] and first["hosts"] == ["node-a"]
    assert update(file, "node-a", True)["changed"] is False
    assert load(file)["node-a"]["reason"] == "serving.yml"
    assert load(file)["node-a"]["since"] == first["time"]
    assert oct(os.stat(file).st_mode & 0o777) == "0o644"  # the gateway's service user reads it
    update(file, "node-b", True)
    assert update(file, "node-a", False)["changed"] is True
    assert update(file, "node-a", False)["changed"] is False
    assert sorted(load(file)) == ["node-b"]


def test_hosts_drained_at_once_are_all_kept(tmp_path):
    """serial > 1: several plays write the file at the same moment; the lock keeps every host."""
    file = str(tmp_path / "drained.json")
    hosts = [f"node-{i}" for i in range(16)]
    threads = [threading.Thread(target=update, args=(file, h, True)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(load(file)) == sorted(hosts)


def test_a_drained_hosts_deployments_are_left_out_unless_none_would_be_left():
    a, b, b2 = deployment("node-a"), deployment("node-b"), deployment("node-b", "embed")
    assert host_of(a) == "node-a" and host_of({"model_info": {"id": "opaque"}}) is None
    assert without([a, b, b2], frozenset({"node-b"})) == [a]
    assert without([a, b], frozenset()) == [a, b]
    assert without([b, b2], frozenset({"node-b"})) == [b, b2]  # every one drained: a host being changed beats none


def test_the_filter_reads_the_file_again_when_it_changes(tmp_path):
    file = str(tmp_path / "drained.json")
    drained = Drained(file)
    assert drained.hosts() == frozenset()
    update(file, "node-a", True)
    assert drained.hosts() == {"node-a"}
    update(file, "node-b", True)
    update(file, "node-a", False)
    assert drained.hosts() == {"node-b"}
    with open(file, "w") as f:  # a broken file keeps the last good reading
        f.write("{not json")
    assert drained.hosts() == {"node-b"}
    os.unlink(file)
    assert drained.hosts() == frozenset()


def test_the_command_line_the_plays_run(tmp_path, capsys):
    file = str(tmp_path / "drained.json")
    assert main(["drain", "node-a", "--file", file, "--reason", "rolling_restart.yml"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] and out["drained"] and out["hosts"] == ["node-a"]
    main(["show", "--file", file])
    assert json.loads(capsys.readouterr().out)["hosts"]["node-a"]["reason"] == "rolling_restart.yml"
    done = subprocess.run([sys.executable, "-m", "dcu_serving.gateway.drained", "undrain", "node-a", "--file", file],
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert json.loads(done.stdout)["hosts"] == []
