"""The fleet through its gateway, as callers and an operator meet it: two 4-card serving hosts behind LiteLLM,
called from the controller with the official openai SDK (the controller is outside the gateway, as a business
system is). Tests run in file order: the key rotation is last, since it changes the gateway's keys.

The nodes are reached with `docker exec` for what only an operator on the host sees (results log, units).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from support import wait_until  # tests/support.py, on pytest's pythonpath

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "fleet")
PROJECT = os.environ["MOLECULE_PROJECT_DIRECTORY"]
MODEL = "MiniCPM-V-4.5"
NODES = ("node-a", "node-b")
RESULTS = "/var/log/dcu-serving/results.jsonl"
APP, LIMITED = "fleet-app", "fleet-limited"
KEYS = {APP: os.environ["DCU_FLEET_APP_KEY"], LIMITED: os.environ["DCU_FLEET_LIMITED_KEY"]}
MASTER = os.environ["DCU_FLEET_MASTER_KEY"]
LIMITED_RPM = 2  # host_vars/gateway.yml
ALLOWED_FAILS = 3  # dcu_gateway_allowed_fails' default


def container(name: str) -> str:
    return f"dcu-mol-{SCENARIO}-{name}"


def on(name: str, *argv: str, check: bool = True) -> str:
    done = subprocess.run(["docker", "exec", container(name), *argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{name}: {argv} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def address(name: str) -> str:
    return subprocess.run([f"{PROJECT}/tools/dcu-node", "address", container(name)], capture_output=True,
                          text=True, check=True).stdout.strip()


def results(name: str) -> list[dict]:
    text = on(name, "sh", "-c", f"cat {RESULTS} 2>/dev/null || true")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def client(key: str) -> openai.OpenAI:
    # No client-side retries: every failure the gateway lets through counts.
    return openai.OpenAI(base_url=f"http://{address('gateway')}:4000/v1", api_key=key, max_retries=0, timeout=60)


def chat(c: openai.OpenAI) -> str:
    answer = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "ping"}], max_tokens=16)
    return answer.choices[0].message.content


def attempt(c: openai.OpenAI):
    """200, or the status (or exception name) of the failure."""
    try:
        chat(c)
        return 200
    except openai.APIStatusError as e:
        return e.status_code
    except openai.APIError as e:
        return type(e).__name__


def app_lines(name: str) -> list[dict]:
    return [r for r in results(name) if r.get("caller") == APP]


def test_chats_through_the_gateway_are_answered_by_both_hosts_with_the_callers_alias():
    before = {n: len(app_lines(n)) for n in NODES}
    app = client(KEYS[APP])
    with ThreadPoolExecutor(8) as pool:  # requests in flight together: least-busy spreads them over the hosts
        answers = list(pool.map(lambda _: chat(app), range(16)))
    assert all(answers)

    def logged():
        new = {n: app_lines(n)[before[n]:] for n in NODES}
        return new if sum(len(v) for v in new.values()) == 16 else None
    new = wait_until(logged, 15, interval=0.5, what="16 results lines with caller fleet-app")
    for n in NODES:
        assert new[n], f"{n} answered none of 16 requests: {[len(v) for v in new.values()]}"
        assert all(r["status"] == 200 and r["backend"] for r in new[n])


def test_a_wrong_key_gets_401_and_a_key_over_its_rpm_429_while_others_go_on():
    with pytest.raises(openai.AuthenticationError) as refused:
        chat(client("sk-nobody-0123456789abcdef"))
    assert refused.value.status_code == 401

    limited = client(KEYS[LIMITED])
    assert [attempt(limited) for _ in range(LIMITED_RPM + 2)] == [200] * LIMITED_RPM + [429, 429]
    assert chat(client(KEYS[APP]))  # another caller is not held back


def test_a_direct_call_to_a_hosts_proxy_gets_403_naming_the_gateway():
    gateway = f"http://{address('gateway')}:4000"
    for n in NODES:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8})
        request = urllib.request.Request(f"http://{address(n)}:8000/v1/chat/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        assert gateway in refused.value.read().decode()


def test_one_hosts_proxy_stopped_the_other_answers_all_but_the_first_allowed_fails_plus_one():
    """The bound: LiteLLM sees a refused connection as a 500, which is not retried (a 500 may follow generated
    tokens); each counts against the host, and the failure past dcu_gateway_allowed_fails (3) leaves the host out
    for the cooldown (30 s). So at most 4 requests fail, whatever the host answered before, and none after."""
    on("node-a", "systemctl", "stop", "dcu-proxy")
    try:
        before = len(app_lines("node-b"))
        app = client(KEYS[APP])
        outcomes = [attempt(app) for _ in range(20)]
        failed = [o for o in outcomes if o != 200]
        assert len(failed) <= ALLOWED_FAILS + 1, outcomes
        assert outcomes[ALLOWED_FAILS + 1:] == [200] * (len(outcomes) - ALLOWED_FAILS - 1), outcomes  # left out
        wait_until(lambda: len(app_lines("node-b")) - before == outcomes.count(200), 15, interval=0.5,
                   what="node-b's results lines for every answered request")
        print(f"one host's proxy stopped: {len(failed)} of {len(outcomes)} requests failed ({failed})")
    finally:
        on("node-a", "systemctl", "start", "dcu-proxy")
    wait_until(lambda: on("node-a", "systemctl", "is-active", "dcu-proxy", check=False).strip() == "active", 30,
               interval=0.5, what="node-a's dcu-proxy active again")


def test_a_rolling_restart_across_both_hosts_under_light_load_fails_no_request(run_playbook):
    started = {n: on(n, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "vllm@0") for n in NODES}
    outcomes: list = []
    stop = threading.Event()

    def caller():
        app = client(KEYS[APP])
        while not stop.is_set():
            outcomes.append(attempt(app))

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        rc, out = run_playbook("rolling_restart.yml", extra_vars={"dcu_vllm_restart_cards": [0, 1]})
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert rc == 0, out[-3000:]
    for n in NODES:  # both hosts' cards were restarted, one host at a time (dcu_serial)
        assert on(n, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "vllm@0") != started[n]
    failures = [o for o in outcomes if o != 200]
    assert len(outcomes) > 20 and not failures, f"{len(failures)} of {len(outcomes)} failed: {failures[:5]}"


def test_the_gateway_is_hardened_keeps_no_key_in_clear_and_rotates_a_key_without_restart(run_playbook, recap):
    # --check changes nothing (the converge and idempotence steps ran it for real).
    rc, out = run_playbook("gateway.yml", "--check", "--diff")
    assert rc == 0, out[-3000:]
    assert recap(out, "gateway")["changed"] == 0

    shown = on("gateway", "systemctl", "show", "dcu-gateway", "-p", "User", "-p", "MainPID", "-p", "ActiveState")
    assert "User=dcu-gateway" in shown and "ActiveState=active" in shown
    pid = next(line for line in shown.splitlines() if line.startswith("MainPID="))

    # Secrets on disk: only digests in the keys file (0600, the service user); the master key 0600 root.
    modes = on("gateway", "stat", "-c", "%n %a %U", "/etc/dcu-gateway/keys.json", "/etc/dcu-gateway/secrets.env",
               "/etc/dcu-gateway/config.yaml").splitlines()
    assert modes == ["/etc/dcu-gateway/keys.json 600 dcu-gateway", "/etc/dcu-gateway/secrets.env 600 root",
                     "/etc/dcu-gateway/config.yaml 640 root"]
    readable = on("gateway", "cat", "/etc/dcu-gateway/keys.json", "/etc/dcu-gateway/config.yaml")
    assert not any(secret in readable for secret in (*KEYS.values(), MASTER))
    assert all(f"http://{address(n)}:8000/v1" in readable for n in NODES)  # both hosts are deployments

    # Rotation: the new key works and the old one is refused at once, without a restart; no key in the output.
    new = "sk-fleet-app-rotated-" + os.urandom(8).hex()
    callers = [{"alias": APP, "key": new, "concurrent": 16}, {"alias": LIMITED, "key": KEYS[LIMITED], "rpm": 2}]
    rc, out = run_playbook("gateway.yml", "--diff", extra_vars={"dcu_gateway_callers": callers})
    assert rc == 0, out[-3000:]
    assert recap(out, "gateway")["changed"] == 1  # the keys file, nothing else
    assert not any(secret in out for secret in (new, *KEYS.values(), MASTER))
    assert chat(client(new))
    assert attempt(client(KEYS[APP])) == 401
    assert pid in on("gateway", "systemctl", "show", "dcu-gateway", "-p", "MainPID")

    # A new master key is read at start: the gateway restarts with it, and neither key shows in the output.
    master = "sk-fleet-master-rotated-" + os.urandom(8).hex()
    rc, out = run_playbook("gateway.yml", "--diff",
                           extra_vars={"dcu_gateway_callers": callers, "dcu_gateway_master_key": master})
    assert rc == 0, out[-3000:]
    assert recap(out, "gateway")["changed"] >= 1
    assert master not in out and MASTER not in out and new not in out
    assert master not in on("gateway", "cat", "/etc/dcu-gateway/keys.json", "/etc/dcu-gateway/config.yaml")
    assert chat(client(new))  # the role waited until it answers again
