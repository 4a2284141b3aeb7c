"""The fleet through its gateway, as callers and an operator meet it: two 4-card serving hosts behind LiteLLM,
called from the controller with the official openai SDK (the controller is outside the gateway, as a business
system is). Tests run in file order: the key rotation is last, since it changes the gateway's keys.

The nodes are reached with `docker exec` for what only an operator on the host sees (results log, units).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import openai
import pytest
from testkit import bundle_copy, rebuild_wheel, wheel_entry

from support import wait_until  # tests/support.py, on pytest's pythonpath

SCENARIO = os.environ.get("MOLECULE_SCENARIO_NAME", "fleet")
PROJECT = os.environ["MOLECULE_PROJECT_DIRECTORY"]
MODEL = "MiniCPM-V-4.5"
NODES = ("node-a", "node-b")
RESULTS = "/var/log/dcu-serving/results.jsonl"
APP, LIMITED = "fleet-app", "fleet-limited"
PROBE = "fleet-probe"
KEYS = {APP: os.environ["DCU_FLEET_APP_KEY"], LIMITED: os.environ["DCU_FLEET_LIMITED_KEY"],
        PROBE: os.environ["DCU_FLEET_PROBE_KEY"]}
MASTER = os.environ["DCU_FLEET_MASTER_KEY"]
PROXY_SECRET = os.environ["DCU_FLEET_PROXY_SECRET"]
LIMITED_RPM = 2  # host_vars/gateway.yml
# The lab CA the gateway's certificate was made with (dcu_gateway_tls: lab), as callers are given it.
GATEWAY_CA = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "tls", "ca.pem")


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


GATEWAYS = ("gateway", "gateway-b")


def floating_address() -> str:
    """The address callers use, held by one gateway at a time (host_vars/gateway.yml: .250 of the network)."""
    return ".".join([*address("gateway").split(".")[:3], "250"])


def holders() -> list[str]:
    """The gateways that hold the floating address now."""
    return [g for g in GATEWAYS if on(g, "ip", "-o", "-4", "addr", "show", "to", f"{floating_address()}/32").strip()]


def gateway_url() -> str:
    return f"https://{floating_address()}:4000"


def verified() -> ssl.SSLContext:
    """What a caller verifies the gateway with: the CA it was given, and the gateway's address as the name."""
    return ssl.create_default_context(cafile=GATEWAY_CA)


def client(key: str, tls: ssl.SSLContext | None = None, retries: int = 0) -> openai.OpenAI:
    # No client-side retries unless asked: every failure the gateway lets through counts.
    return openai.OpenAI(base_url=f"{gateway_url()}/v1", api_key=key, max_retries=retries, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=tls or verified()))


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


DRAINED = "/var/lib/dcu-gateway/drained.json"  # dcu_serving.gateway.drained's default


def drained_now() -> tuple[float, dict]:
    """(the time just before the gateway's drained-hosts file was read, {host: {since, reason}})."""
    started = time.time()
    text = on("gateway", "sh", "-c", f"cat {DRAINED} 2>/dev/null || true")
    return started, (json.loads(text)["hosts"] if text.strip() else {})


def started_at(record: dict) -> float:
    """When a results line's request reached the host (its `time` is when it ended)."""
    return datetime.fromisoformat(record["time"]).timestamp() - record["latency_ms"] / 1000


def normalized(text: str) -> str:
    """Playbook output with its line wrapping undone."""
    return " ".join(text.split())


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


def test_callers_reach_the_gateway_over_tls_only_and_verify_it_with_the_lab_ca():
    """The gateway speaks HTTPS only: a caller that verifies with the lab's CA gets its answer; one that trusts only
    the system's CAs refuses the certificate before any key is sent; plain HTTP gets no API answer. The key stays
    on the gateway, readable by its service's group only."""
    assert chat(client(KEYS[APP]))
    with pytest.raises(openai.APIConnectionError) as untrusted:
        chat(client(KEYS[APP], tls=ssl.create_default_context()))
    assert "CERTIFICATE_VERIFY_FAILED" in repr(untrusted.value.__cause__) + repr(untrusted.value.__context__)
    plain = f"http://{address('gateway')}:4000/v1/models"
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(urllib.request.Request(plain, headers={"Authorization": f"Bearer {KEYS[APP]}"}),
                               timeout=10)
    modes = on("gateway", "stat", "-c", "%n %a %U:%G", "/etc/dcu-gateway/tls/gateway.key",
               "/etc/dcu-gateway/tls/gateway.pem").splitlines()
    assert modes == ["/etc/dcu-gateway/tls/gateway.key 640 root:dcu-gateway",
                     "/etc/dcu-gateway/tls/gateway.pem 644 root:root"]
    assert oct(os.stat(os.path.join(os.path.dirname(GATEWAY_CA), "gateway.key")).st_mode & 0o777) == "0o600"


def test_a_direct_call_to_a_hosts_proxy_gets_403_naming_the_gateway_and_plain_http_no_answer():
    """The hosts behind the gateway follow its TLS (dcu_proxy_tls: lab, from the gateways' setting): their API is on
    TLS, verified with the same lab CA; plain HTTP stays on each host's loopback, for its own checks."""
    gateway = gateway_url()
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}).encode()
    for n in NODES:
        request = urllib.request.Request(f"https://{address(n)}:8443/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10, context=verified())
        assert refused.value.code == 403
        assert gateway in refused.value.read().decode()
        plain = urllib.request.Request(f"http://{address(n)}:8000/v1/chat/completions", data=body,
                                       headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.URLError) as no_answer:
            urllib.request.urlopen(plain, timeout=10)
        assert isinstance(no_answer.value.reason, ConnectionRefusedError), no_answer.value
        modes = on(n, "stat", "-c", "%n %a %U:%G", "/etc/dcu-serving/tls/proxy.key",
                   "/etc/dcu-serving/tls/proxy.pem").splitlines()
        assert modes == ["/etc/dcu-serving/tls/proxy.key 640 root:dcu-proxy",
                         "/etc/dcu-serving/tls/proxy.pem 644 root:root"]


def _status_from(name: str, url: str, headers: dict, cafile: str | None = None) -> int:
    """The status of a small chat posted by a process on node `name` (from that node's own address), verifying an
    https URL with `cafile` on that node."""
    script = ("import json, ssl, sys, urllib.error, urllib.request\n"
              "body = json.dumps({'model': sys.argv[3], 'messages': [{'role': 'user', 'content': 'ping'}],"
              " 'max_tokens': 8}).encode()\n"
              "request = urllib.request.Request(sys.argv[1], data=body, headers=json.loads(sys.argv[2]))\n"
              "tls = ssl.create_default_context(cafile=sys.argv[4]) if sys.argv[4] else None\n"
              "try:\n    print(urllib.request.urlopen(request, timeout=60, context=tls).status)\n"
              "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    return int(on(name, "python3", "-c", script, url, json.dumps(headers), MODEL, cafile or "").strip())


# What the gateway verifies the hosts with (dcu_gateway_hosts_ca: the CA the hosts export).
HOSTS_CA = "/etc/dcu-gateway/hosts-ca.pem"


def test_a_forged_caller_on_an_allowed_address_is_refused_while_the_gateways_calls_pass():
    """node-a answers the API to the gateway only, and its address proves nothing: a process on the gateway's own
    machine (its address is the allowed one) or on node-a itself (loopback) naming a caller is refused without the
    gateway's secret, and with a wrong one; nothing reaches a card. The gateway's calls carry the secret (the previous
    tests' chats), and a call carrying it is answered with its caller believed. LiteLLM's /health - a completion on
    every deployment - is for the probe key, not a caller's."""
    url = f"https://{address('node-a')}:8443/v1/chat/completions"
    forged = {"Content-Type": "application/json", "X-Caller": APP}
    before = len(results("node-a"))
    assert _status_from("gateway", url, forged, HOSTS_CA) == 403
    assert _status_from("node-a", "http://127.0.0.1:8000/v1/chat/completions", forged) == 403
    wrong = {**forged, "Authorization": "Bearer fleet-proxy-secret-wrong-0123456789"}
    assert _status_from("gateway", url, wrong, HOSTS_CA) == 403
    assert len(results("node-a")) == before, "a refused call reached a card"
    proven = {**forged, "X-Caller": "fleet-proven", "Authorization": f"Bearer {PROXY_SECRET}"}
    assert _status_from("gateway", url, proven, HOSTS_CA) == 200
    wait_until(lambda: any(r.get("caller") == "fleet-proven" for r in results("node-a")), 15, interval=0.5,
               what="the proven call's results line naming its caller")

    health = f"{gateway_url()}/health?model_id=node-a/{MODEL}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(health, headers={"Authorization": f"Bearer {KEYS[APP]}"}),
                               timeout=60, context=verified())
    assert refused.value.code == 403 and "inference paths only" in refused.value.read().decode()
    with urllib.request.urlopen(urllib.request.Request(health, headers={"Authorization": f"Bearer {KEYS[PROBE]}"}),
                                timeout=120, context=verified()) as answer:
        assert json.loads(answer.read())["healthy_count"] == 1


def test_one_hosts_proxy_stopped_the_other_answers_all_but_the_first(run_playbook, tmp_path):
    """The bound: LiteLLM sees a refused connection as a 500, which is not retried (a 500 may follow generated
    tokens); the gateway's hook reads the cause (nothing was sent) and leaves the host out for the cooldown (30 s)
    at once. So one request fails (one gateway worker), whatever the host answered before, and none after."""
    on("node-a", "systemctl", "stop", "dcu-proxy")
    try:
        before = len(app_lines("node-b"))
        app = client(KEYS[APP])
        outcomes = [attempt(app) for _ in range(20)]
        failed = [o for o in outcomes if o != 200]
        assert len(failed) <= 1, outcomes
        assert outcomes[1:] == [200] * (len(outcomes) - 1), outcomes  # left out at the first refusal
        wait_until(lambda: len(app_lines("node-b")) - before == outcomes.count(200), 15, interval=0.5,
                   what="node-b's results lines for every answered request")
        print(f"one host's proxy stopped: {len(failed)} of {len(outcomes)} requests failed ({failed})")

        # verify.yml's gateway play names the host and model the gateway cannot reach, and only those.
        rc, out = run_playbook("verify.yml", "--limit", "gateway",
                               extra_vars={"dcu_verify_report_dir": str(tmp_path), "dcu_gateway_verify_timeout": 5})
        assert rc != 0, out[-3000:]
        out = normalized(out)
        assert f"the gateway does not reach node-a {MODEL}" in out, out[-3000:]
        assert "does not reach node-b" not in out
        assert f"gateway -> node-b {MODEL}: 1/1 through the gateway" in out
        assert KEYS[APP] not in out
        gateway = json.loads((tmp_path / "fleet.json").read_text())["gateway"]
        assert [(d["host"], d["ok"]) for d in gateway["deployments"]] == [("node-a", False), ("node-b", True)]
        print("verify.yml with node-a's proxy stopped: " + out[out.index("the gateway does not reach"):][:300])
    finally:
        on("node-a", "systemctl", "start", "dcu-proxy")
    # `start` returns once the proxy serves with its cards checked (Type=notify), before the next test's callers:
    # on 2026-12-06, with the unit active before the proxy listened, their first two requests met that gap (500s).


def test_a_rolling_restart_across_both_hosts_under_light_load_fails_no_request_and_skips_the_drained_host(
        run_playbook):
    """Each host leaves the gateway's rotation before its restart and rejoins once it serves N/N. Two callers send
    requests through the gateway all along, each answer naming the host's request id (LiteLLM passes dcu-proxy's
    X-Request-Id on as llm_provider-x-request-id; it drops the `user` orid); the gateway's drained-hosts file is
    watched. A request sent after a host was drained (the file's `since`) and answered before it was seen undrained
    was routed while the host was out: its results line must be on the other host. And no results line on the
    drained host starts in that time (0.5 s allowed for a request routed just before the drain to arrive)."""
    started = {n: on(n, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "vllm@0") for n in NODES}
    sent: list = []  # (orid, sent at, answered at, outcome)
    seen: list = []  # (read at, {host: {since, reason}})
    stop = threading.Event()

    def caller():
        app = client(KEYS[APP])
        while not stop.is_set():
            t0, rid = time.time(), None
            try:
                raw = app.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "ping"}], max_tokens=16)
                raw.parse()
                rid, outcome = raw.headers.get("llm_provider-x-request-id"), 200
            except openai.APIStatusError as e:
                outcome = e.status_code
            except openai.APIError as e:
                outcome = type(e).__name__
            sent.append((rid, t0, time.time(), outcome))

    def watcher():
        while not stop.is_set():
            seen.append(drained_now())
            stop.wait(0.2)

    threads = [threading.Thread(target=caller) for _ in range(2)] + [threading.Thread(target=watcher)]
    for t in threads:
        t.start()
    try:
        began = time.monotonic()
        rc, out = run_playbook("rolling_restart.yml", extra_vars={"dcu_vllm_restart_cards": [0, 1]})
        took = time.monotonic() - began
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert rc == 0, out[-3000:]
    for n in NODES:  # both hosts' cards were restarted, one host at a time (dcu_serial)
        assert on(n, "systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "vllm@0") != started[n]
    failures = [o for o in sent if o[3] != 200]
    spans = {n: [read_at for read_at, hosts in seen if n in hosts] for n in NODES}
    when = "; ".join(f"{n} seen drained {min(r):.1f}-{max(r):.1f}" if r else f"{n} never seen drained"
                     for n, r in spans.items())
    assert len(sent) > 20 and not failures, \
        f"{len(failures)} of {len(sent)} failed: {failures[:5]} ({when}); the playbook's end: {out[-2500:]}"
    assert drained_now()[1] == {}, "a host was left drained"

    assert all(o[0] for o in sent), "an answer without the host's request id"
    lines = {n: results(n) for n in NODES}
    by_rid = {n: {r["request_id"] for r in lines[n]} for n in NODES}
    for n in NODES:
        other = next(o for o in NODES if o != n)
        drains = [hosts[n]["since"] for _, hosts in seen if n in hosts]
        assert drains, f"{n} was never seen drained on the gateway during the rolling restart"
        since = min(drains)
        # The last read that still found it drained: it was undrained after that read began.
        out_until = max(read_at for read_at, hosts in seen if n in hosts)
        assert not any(n in hosts for read_at, hosts in seen if read_at > out_until)
        inside = [o for o in sent if o[1] > since and o[2] < out_until]
        assert inside, f"no request was sent and answered while {n} was drained ({out_until - since:.1f} s)"
        on_drained = [o[0] for o in inside if o[0] in by_rid[n]]
        assert not on_drained, f"{n} answered {len(on_drained)} requests sent while it was drained: {on_drained[:5]}"
        missing = [o[0] for o in inside if o[0] not in by_rid[other]]
        assert not missing, f"requests sent while {n} was drained are in no results log: {missing[:5]}"
        started_inside = [r for r in lines[n] if r.get("caller") == APP
                          and since + 0.5 < started_at(r) < out_until]
        assert not started_inside, f"{n} took requests while drained: {started_inside[:3]}"
        print(f"{n}: out of the gateway's rotation for at least {out_until - since:.1f} s; {len(inside)} requests "
              f"sent and answered meanwhile, all by {other}")
    print(f"rolling restart under load: {len(sent)} requests, {len(failures)} failed, playbook {took:.0f} s")


def test_verify_reports_each_host_and_model_through_the_gateway(run_playbook, tmp_path):
    rc, out = run_playbook("verify.yml", extra_vars={"dcu_verify_report_dir": str(tmp_path)})
    assert rc == 0, out[-3000:]
    out = normalized(out)
    for n in NODES:
        assert f"gateway -> {n} {MODEL}: 1/1 through the gateway, 4/4 healthy behind its proxy" in out, out[-3000:]
    fleet = json.loads((tmp_path / "fleet.json").read_text())
    assert fleet["hosts"] == 2 and fleet["gateway"]["ok"]
    assert sorted((d["host"], d["model"], d["reached"], d["healthy"]) for d in fleet["gateway"]["deployments"]) == [
        (n, MODEL, "1/1", "4/4") for n in NODES]
    md = (tmp_path / "fleet.md").read_text()
    assert all(f"| {n} | {MODEL} | 1/1 | 4/4 |" in md for n in NODES), md
    assert KEYS[APP] not in out  # the probes' caller key is never shown
    assert f"{floating_address()} is on {holders()[0]}" in out  # one gateway holds the callers' address


def test_a_failed_change_leaves_the_host_drained_only_if_it_is_broken(run_playbook):
    absent = {"dcu_vllm_model_dir": "/srv/models/absent", "dcu_gateway_drain_failed_timeout": 5}
    # The change fails before touching anything: the host still serves, so it is back in the rotation.
    rc, out = run_playbook("serving.yml", "--limit", "node-a", extra_vars=absent)
    assert rc != 0
    out = normalized(out)
    assert "/srv/models/absent does not exist" in out, out[-3000:]
    assert "node-a serves 4/4 and is back in the rotation of the gateway" in out, out[-3000:]
    assert drained_now()[1] == {}

    # The same failure on a host whose proxy is down: broken, so it stays out of the rotation, and the message
    # says so and how to put it back.
    on("node-a", "systemctl", "stop", "dcu-proxy")
    try:
        rc, out = run_playbook("serving.yml", "--limit", "node-a", extra_vars=absent)
        assert rc != 0
        out = normalized(out)
        assert "/srv/models/absent does not exist" in out, out[-3000:]
        assert "node-a is broken (" in out and "stays out of the rotation of the gateway" in out, out[-3000:]
        assert "dcu_serving.gateway.drained undrain node-a" in out
        assert list(drained_now()[1]) == ["node-a"]
        print("a broken host's failure: " + out[out.index("-- node-a is broken"):][:400])
    finally:
        on("node-a", "systemctl", "start", "dcu-proxy")
        on("gateway", "/opt/dcu-gateway/venv/bin/python", "-m", "dcu_serving.gateway.drained", "undrain", "node-a")
    wait_until(lambda: on("node-a", "systemctl", "is-active", "dcu-proxy", check=False).strip() == "active", 30,
               interval=0.5, what="node-a's dcu-proxy active again")


GATEWAY_VENV = "/opt/dcu-gateway/venv"  # dcu_gateway_venv's default


def newer_bundle(tmp_path, name: str, damage_litellm: bool = False) -> str:
    """The scenario's bundle with a rebuilt dcu-serving wheel: a new venv for the gateway. damage_litellm: LiteLLM's
    wheel no longer matches its hash."""
    def change(index, root):
        rebuild_wheel(index, root, "dcu-serving")
        if damage_litellm:
            with open(root / wheel_entry(index, "litellm")["file"], "ab") as f:
                f.write(b"not the wheel that was pinned")
    return bundle_copy(tmp_path, name, change)


def gateway_unit(*props: str) -> dict:
    shown = on("gateway", "systemctl", "show", "dcu-gateway", *(f"--property={p}" for p in props))
    return dict(line.split("=", 1) for line in shown.splitlines())


def test_a_new_bundle_is_built_beside_the_running_gateway_and_a_broken_one_changes_nothing(run_playbook, tmp_path):
    old, pid = on("gateway", "readlink", GATEWAY_VENV).strip(), gateway_unit("MainPID")["MainPID"]
    built = on("gateway", "stat", "--format=%Y", f"/opt/dcu-gateway/{old}/.dcu-gateway-digest")

    # A wheel that does not match its pin: pip refuses it, the link and the running gateway are left alone.
    # On one gateway, as an operator tries a bundle first (--limit): the other's build would be the same, only longer.
    one = ("--limit", "!gateway-b")
    rc, out = run_playbook("gateway.yml", *one,
                           extra_vars={"dcu_gateway_bundle_dir": newer_bundle(tmp_path, "broken", True)})
    assert rc != 0 and "DO NOT MATCH THE HASHES" in out, out[-3000:]
    assert on("gateway", "readlink", GATEWAY_VENV).strip() == old
    assert gateway_unit("MainPID")["MainPID"] == pid
    assert chat(client(KEYS[APP]))

    # A good one: built while the old gateway answers, switched to, then one restart. Callers fail at most while
    # it restarts (no client retry here), never during the build.
    sent: list[tuple[float, object]] = []
    stop = threading.Event()

    def steady():
        c = client(KEYS[APP])
        while not stop.is_set():
            sent.append((time.monotonic(), attempt(c)))
            stop.wait(0.5)

    caller = threading.Thread(target=steady)
    caller.start()
    try:
        good = newer_bundle(tmp_path, "good")
        rc, out = run_playbook("gateway.yml", *one, extra_vars={"dcu_gateway_bundle_dir": good})
    finally:
        stop.set()
        caller.join()
    assert rc == 0, out[-3000:]
    new = on("gateway", "readlink", GATEWAY_VENV).strip()
    assert new != old and on("gateway", "readlink", f"{GATEWAY_VENV}.previous").strip() == old
    on("gateway", "test", "-f", f"{GATEWAY_VENV}/lib/python3.11/site-packages/dcu_serving/_rebuilt.txt")
    left = on("gateway", "sh", "-c", f"ls -d {GATEWAY_VENV}-*").split()
    assert sorted(left) == sorted(f"/opt/dcu-gateway/{v}" for v in (old, new)), left  # the broken build is gone
    unit = gateway_unit("MainPID", "ActiveExitTimestampMonotonic")
    assert unit["MainPID"] != pid
    stopped = int(unit["ActiveExitTimestampMonotonic"]) / 1e6  # the restart's stop: same clock as time.monotonic()
    failed = [(t, r) for t, r in sent if r != 200]
    answered_before = [t for t, r in sent if r == 200 and t < stopped]
    print(f"gateway venv switch: {len(sent)} requests, {len(answered_before)} answered by the old gateway during "
          f"the play, {len(failed)} failed around the restart")
    assert len(answered_before) >= 10, sent  # the build took tens of seconds, the old gateway answered throughout
    assert all(t > stopped - 1 for t, _ in failed), (stopped, failed)
    assert chat(client(KEYS[APP]))

    # Back to the scenario's bundle: its venv is the one kept, switched back to without a build.
    rc, out = run_playbook("gateway.yml", *one)
    assert rc == 0, out[-3000:]
    assert on("gateway", "readlink", GATEWAY_VENV).strip() == old
    assert on("gateway", "readlink", f"{GATEWAY_VENV}.previous").strip() == new
    assert on("gateway", "stat", "--format=%Y", f"/opt/dcu-gateway/{old}/.dcu-gateway-digest") == built
    assert chat(client(KEYS[APP]))


def test_two_gateways_behind_one_address_lose_at_most_the_requests_in_flight_on_the_one_stopped():
    """Callers use the floating address; keepalived on both gateways (VRRP over unicast, a check of the local LiteLLM
    every second) keeps it on a live one. Under steady load - 4 callers with the openai SDK retrying a refused
    connection, as callers do - the gateway that holds it is stopped: at most the requests in flight on it fail, the
    address moves within seconds, the rest are answered through the other gateway, and the first one, back, does not
    take the address back (nopreempt: that would break the other's connections a second time)."""
    held = holders()
    assert len(held) == 1, held  # one gateway at a time (the first of the group, unless a restart moved it)
    holder, other = held[0], next(g for g in GATEWAYS if g != held[0])
    outcomes: list[tuple[float, float, object]] = []
    done = threading.Event()

    def caller():
        c = client(KEYS[APP], retries=5)  # backoff 0.5, 1, 2, 4, 8 s: longer than the address takes to move
        while not done.is_set():
            began = time.monotonic()
            status = attempt(c)
            outcomes.append((began, time.monotonic(), status))

    callers = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
    for t in callers:
        t.start()
    try:
        wait_until(lambda: len(outcomes) >= 12, 60, interval=0.2, what="12 answers before the stop")
        stopped_at = time.monotonic()
        on(holder, "systemctl", "stop", "dcu-gateway")
        wait_until(lambda: holders() == [other], 30, interval=0.2, what=f"the address on {other}")
        moved_after = time.monotonic() - stopped_at
        answered_before = len(outcomes)
        wait_until(lambda: len(outcomes) >= answered_before + 12, 60, interval=0.2,
                   what=f"12 answers through {other}")
    finally:
        done.set()
        for t in callers:
            t.join(90)
    in_flight = sum(1 for began, ended, _ in outcomes if began <= stopped_at <= ended)
    failed = [o for o in outcomes if o[2] != 200]
    print(f"failover from {holder} to {other}: the address moved {moved_after:.1f} s after the stop; "
          f"{len(outcomes)} requests, {len(failed)} failed ({[o[2] for o in failed]}), "
          f"{in_flight} in flight at the stop")
    assert len(failed) <= in_flight, (failed, in_flight)
    assert all(o[2] == 200 for o in outcomes if o[0] > stopped_at + moved_after)

    started = on(holder, "date", "+%Y-%m-%d %H:%M:%S").strip()
    on(holder, "systemctl", "start", "dcu-gateway")
    wait_until(lambda: "Entering BACKUP STATE" in on(holder, "journalctl", "-u", "keepalived", "--since", started,
                                                      "--no-pager", check=False), 120, interval=1,
               what=f"{holder}'s keepalived back as BACKUP once its LiteLLM answers")
    assert holders() == [other]
    assert chat(client(KEYS[APP]))


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
    assert not any(secret in readable for secret in (*KEYS.values(), MASTER, PROXY_SECRET))
    # both hosts are deployments, over TLS verified with the hosts' CA (LiteLLM's own bundle knows no lab CA)
    assert all(f"https://{address(n)}:8443/v1" in readable for n in NODES)
    assert f"ssl_verify: {HOSTS_CA}" in readable

    # Rotation: the new key works and the old one is refused at once, without a restart; no key in the output.
    new = "sk-fleet-app-rotated-" + os.urandom(8).hex()
    callers = [{"alias": APP, "key": new, "concurrent": 16}, {"alias": LIMITED, "key": KEYS[LIMITED], "rpm": 2},
               {"alias": PROBE, "key": KEYS[PROBE], "probe": True}]
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
    assert master not in out and MASTER not in out and new not in out and PROXY_SECRET not in out
    assert master not in on("gateway", "cat", "/etc/dcu-gateway/keys.json", "/etc/dcu-gateway/config.yaml")
    assert chat(client(new))  # the role waited until it answers again
