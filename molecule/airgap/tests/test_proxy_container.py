"""dcu_proxy_runtime: container on `air` (host_vars/air.yml), as on a CentOS 7.6, Kylin V10 or Ubuntu 20.04
host whose python3 is older than dcu-serving needs: the bundle's proxy image, run by systemd."""

from __future__ import annotations

import json
import uuid

from proxycalls import BACKENDS, call, command_line, main_pid, results_line, user_of
from testkit import PROJECT

from support import wait_until

testinfra_hosts = ["air"]


def test_the_proxy_answers_8000_with_x_backend_and_logs_the_orid(host):
    orid = f"air-{uuid.uuid4().hex[:10]}"
    answer = call(host, orid)
    assert answer["status"] == 200 and answer["headers"]["X-Backend"] in BACKENDS
    record = results_line(host, orid)
    assert record["status"] == 200 and record["backend"] == answer["headers"]["X-Backend"]


def test_the_container_runs_as_dcu_proxy_confined_and_owned_by_systemd(host):
    assert host.service("dcu-proxy").is_running and host.service("dcu-proxy").is_enabled
    assert not host.file("/opt/dcu-serving/venv").exists  # nothing of the host's Python
    box = json.loads(host.check_output("docker inspect dcu-proxy"))[0]
    uid, gid = host.check_output("id -u dcu-proxy"), host.check_output("id -g dcu-proxy")
    config = box["HostConfig"]
    assert box["Config"]["User"] == f"{uid}:{gid}"
    assert config["NetworkMode"] == "host" and config["ReadonlyRootfs"] is True
    assert config["CapDrop"] == ["ALL"] and "no-new-privileges" in config["SecurityOpt"]
    assert sorted(config["Binds"]) == ["/etc/dcu-serving:/etc/dcu-serving:ro",
                                       "/var/log/dcu-serving:/var/log/dcu-serving:rw"]
    artifacts = json.loads((PROJECT / "build/bundle/index.json").read_text())["artifacts"]
    digest = next(a["config_digest"] for a in artifacts if a["kind"] == "image" and a["name"] == "proxy")
    assert box["Image"] == digest  # the bundle's image, by its config digest
    pid = box["State"]["Pid"]
    assert user_of(host, pid) == "dcu-proxy"
    status = host.file(f"/proc/{pid}/status").content_string
    assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
    # The unit's main process is the attached client: systemd starts, stops and restarts the container.
    assert "docker run --rm --name=dcu-proxy" in command_line(host, main_pid(host))


def test_reload_reaches_the_container_and_the_rotated_log_is_reopened(host):
    container = host.check_output("docker inspect --format={{.Id}} dcu-proxy")
    since = host.check_output("date +%s")
    host.check_output("systemctl reload dcu-proxy")
    wait_until(lambda: "reloaded /etc/dcu-serving/proxy.yml" in host.check_output(
        f"journalctl --unit=dcu-proxy --since=@{since} --no-pager"), 10, interval=0.3, what="the reload in the journal")
    rotate = host.run("logrotate --force /etc/logrotate.d/dcu-serving")  # postrotate: systemctl reload
    assert rotate.rc == 0, rotate.stderr
    orid = f"air-rotated-{uuid.uuid4().hex[:8]}"
    assert call(host, orid)["status"] == 200
    assert results_line(host, orid)["status"] == 200  # in the new file, written by the same container
    assert host.check_output("docker inspect --format={{.Id}} dcu-proxy") == container


def test_a_bad_configuration_is_refused_by_the_images_check_before_it_is_written(host, run_playbook, recap):
    before, pid = host.file("/etc/dcu-serving/proxy.yml").content_string, main_pid(host)
    rc, out = run_playbook("serving.yml", "--limit", "air",
                           extra_vars={"dcu_proxy_settings": {"health": {"timeout": 60}}})
    assert rc != 0 and "dcu-proxy: configuration error: health.timeout" in out, out[-3000:]
    assert recap(out, "air")["changed"] == 0
    assert host.file("/etc/dcu-serving/proxy.yml").content_string == before and main_pid(host) == pid
