"""The service contract: each rule rejects with a 400 that says what to change, or (relaxed) fixes it."""

from __future__ import annotations

import base64
import gzip
import io
import json
import socket

import pytest
import requests
from PIL import Image
from proxy.proxytools import FAST, body

from dcu_serving.proxy import contract
from dcu_serving.proxy.config import Contract
from dcu_serving.proxy.errors import ProxyError
from support import SERVED_MODEL, wait_until

STRICT = Contract()
RELAXED = Contract("coerce", "move", "allow", "pass", 0)
PNG = "data:image/png;base64,iVBORw0KGgo="


def check(payload, rules=STRICT, raw: bytes | None = None):
    raw = raw if raw is not None else json.dumps(payload).encode()
    return contract.check(raw, contract.parse(raw), rules)


def rejected(payload, rules=STRICT) -> ProxyError:
    with pytest.raises(ProxyError) as e:
        check(payload, rules)
    assert e.value.status == 400
    return e.value


def images(n: int, url: str = PNG) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url}} for _ in range(n)]
    return body(messages=[{"role": "user", "content": [*content, {"type": "text", "text": "read"}]}])


def test_a_conforming_request_is_forwarded_byte_for_byte():
    raw = b'{"model": "MiniCPM-V-4.5",  "user": "7", "messages": [{"role": "user", "content": "hi"}]}'
    call = check(None, raw=raw)
    assert call.body is raw
    assert (call.model, call.orid, call.stream, call.strip_usage) == (SERVED_MODEL, "7", False, False)


def test_an_integer_user_is_rejected_with_the_fix():
    e = rejected(body(user=12345))
    assert e.param == "user"
    assert "str(orid)" in e.message and '"12345"' in e.message


def test_relaxed_user_is_sent_as_a_string():
    call = check(body(user=12345), RELAXED)
    assert json.loads(call.body)["user"] == "12345"
    assert call.orid == "12345"


def test_top_level_enable_thinking_is_rejected_with_the_fix():
    e = rejected({**body(), "enable_thinking": False})
    assert e.param == "enable_thinking"
    assert "chat_template_kwargs" in e.message


def test_relaxed_enable_thinking_moves_into_chat_template_kwargs():
    payload = {"model": SERVED_MODEL, "messages": [], "enable_thinking": False}
    sent = json.loads(check(payload, RELAXED).body)
    assert "enable_thinking" not in sent
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    # an explicit chat_template_kwargs value wins over the misplaced one
    payload = {**payload, "enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False, "x": 1}}
    assert json.loads(check(payload, RELAXED).body)["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}


@pytest.mark.parametrize("url", ["http://example.com/a.png", "HTTPS://example.com/b.jpg"])
def test_a_remote_image_url_is_rejected_at_once(url):
    e = rejected(images(1, url))
    assert e.param == "messages[0].content[0].image_url"
    assert "offline" in e.message and "data:image/jpeg;base64" in e.message
    check(images(1, url), Contract(image_urls="allow"))  # allowed when relaxed


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "image_url", "image_url": {"url": " http://10.0.0.1/a.png"}}, "image_url"),  # a leading space
    ({"type": "image_url", "image_url": {"url": "ht\ttp://10.0.0.1/a.png"}}, "image_url"),  # urllib drops the tab
    ({"type": "image_url", "image_url": "\x00https://10.0.0.1/a.png"}, "image_url"),  # a string, a control char
    ({"type": "input_image", "image_url": "https://10.0.0.1/a.png"}, "image_url"),  # the Responses API's form
    ({"type": "image_url", "image_url": {"url": "file:///etc/shadow"}}, "image_url"),
    ({"type": "video_url", "video_url": {"url": "http://10.0.0.1/v.mp4"}}, "video_url"),
    ({"type": "audio_url", "audio_url": {"url": "HTTPS://10.0.0.1/a.wav"}}, "audio_url"),
    ({"video_url": "ftp://10.0.0.1/v.mp4"}, "video_url"),  # no type: vLLM goes by the key
    ({"type": "file", "file": {"file_id": "file-abc"}}, "file"),
    ({"type": "file", "file": {"file_url": "http://10.0.0.1/a.pdf", "file_data": "JVBERi0="}}, "file"),
])
def test_every_media_part_that_would_be_fetched_is_rejected(part, param):
    payload = body(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, part]}])
    e = rejected(payload)
    assert e.param == f"messages[0].content[1].{param}"
    assert "offline" in e.message
    check(payload, Contract(image_urls="allow"))  # allowed when the cluster may fetch


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": " DATA:image/png;base64,iVBORw0KGgo="}},
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
])
def test_inline_media_passes(part):
    check(body(messages=[{"role": "user", "content": [part, {"type": "text", "text": "see"}]}]))


def test_more_images_than_allowed_are_rejected():
    check(images(9))
    e = rejected(images(10))
    assert "10 images" in e.message and "at most 9" in e.message
    check(images(10), Contract(max_images=0))


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe{}", b"", b'{"a": ' + b"[" * 100_000])
def test_malformed_json_is_rejected(raw):
    with pytest.raises(ProxyError) as e:
        contract.parse(raw)
    assert e.value.status == 400 and "JSON" in e.value.message


@pytest.mark.parametrize("raw", [
    b'\xef\xbb\xbf{"model": "m"}',               # a UTF-8 byte order mark
    '{"model": "m"}'.encode("utf-16"),              # UTF-16, as json.loads detects it
    b'{"model": "m", "temperature": NaN}',          # a literal the standard library reads
    b'{"model": "m", "user": "\\ud800"}',           # a lone surrogate escape
    b'{"model": "m", "user": -9223372036854775809}',  # below 64 bits
])
def test_requests_read_exactly_as_the_standard_library_reads_them(raw):
    parsed = contract.parse(raw)  # orjson refuses or misreads each of these: the standard library takes over
    assert json.dumps(parsed) == json.dumps(json.loads(raw))


def test_a_rewritten_request_keeps_every_long_integer():
    raw = json.dumps({"model": SERVED_MODEL, "user": "7", "seed": 2**70 + 1, "enable_thinking": False}).encode()
    call = check(None, Contract(enable_thinking="move"), raw=raw)
    assert json.loads(call.body) == {"model": SERVED_MODEL, "user": "7", "seed": 2**70 + 1,
                                     "chat_template_kwargs": {"enable_thinking": False}}


def test_a_long_numeric_user_is_quoted_exactly_in_the_rejection():
    e = rejected(body(user=2**80))
    assert f'"{2**80}"' in e.message


def test_a_stream_asks_for_usage_without_re_serialising():
    raw = b' {"model":"MiniCPM-V-4.5","stream":true,"messages":[{"role":"user","content":"h\\u00e9"}]}'
    call = check(None, raw=raw)
    assert call.stream and call.strip_usage
    assert call.body.endswith(raw[2:])  # the caller's bytes, only the option put in front
    assert json.loads(call.body) == {**json.loads(raw), "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("options", [None, {"include_usage": False}, {"include_usage": "false"},
                                     {"continuous_usage_stats": True}])
def test_a_stream_gets_usage_whatever_its_stream_options_hold(options):
    """vLLM reads what the proxy wrote: usage asked for, once, at the end; the caller's usage removed again."""
    call = check(body(stream=True, stream_options=options))
    sent = json.loads(call.body)
    assert sent["stream_options"]["include_usage"] is True
    assert sent["stream_options"]["continuous_usage_stats"] is False
    assert call.stream and call.strip_usage


@pytest.mark.parametrize("stream", ["true", 1, "on"])
def test_a_stream_asked_for_as_vllm_reads_it_is_a_stream(stream):
    call = check(body(stream=True, stream_options="not an object"))  # vLLM's 400: left for vLLM to say
    assert json.loads(call.body)["stream_options"] == "not an object"
    call = check(body(stream=stream))
    assert call.stream and call.strip_usage
    assert json.loads(call.body)["stream_options"]["include_usage"] is True
    call = check(body(stream=stream, stream_options={"include_usage": "yes"}))
    assert call.stream and not call.strip_usage  # asked for, as vLLM reads it: passed on to the caller


def test_a_stream_that_asks_for_usage_keeps_it():
    call = check(body(stream=True, stream_options={"include_usage": True}))
    assert call.stream and not call.strip_usage
    call = check(body(stream=True, stream_options={"continuous_usage_stats": False}))
    assert json.loads(call.body)["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert call.strip_usage


# -- over HTTP, through the proxy, against the simulator --

@pytest.fixture
def proxy(start_sim, start_proxy):
    sim = start_sim(*FAST)
    return start_proxy([sim.url], max_body_bytes=4096)


def test_rejections_over_http_use_the_envelope_and_are_logged(proxy):
    cases = [
        (body(user=12345), 400, "user"),
        ({**body(), "enable_thinking": True}, 400, "enable_thinking"),
        (images(1, "https://example.com/x.png"), 400, "messages[0].content[0].image_url"),
        (body(model="gpt-4o"), 404, "model"),  # an unknown model: vLLM's NotFoundError
    ]
    for payload, status, param in cases:
        r = proxy.chat(payload, headers={"X-Request-Id": f"reject-{param}"})
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param
        kind = "NotFoundError" if status == 404 else "BadRequestError"
        assert r.json()["error"]["type"] == kind and r.json()["error"]["code"] == status
        assert r.headers["X-Backend"] == "dcu-proxy"
        assert r.headers["X-Request-Id"] == f"reject-{param}"

    r = proxy.chat(b"{broken", headers={"X-Request-Id": "broken"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = proxy.chat(json.dumps(body()), headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and "application/json" in r.json()["error"]["message"]
    r = proxy.chat(body(text="x" * 5000))
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]
    assert r.headers["X-Backend"] == "dcu-proxy" and r.headers["X-Request-Id"]

    lines = proxy.results(count=7)
    assert [line["status"] for line in lines] == [400] * 3 + [404] + [400] * 2 + [413]
    assert lines[0]["orid"] == "12345" and lines[0]["request_id"] == "reject-user"
    assert all(line["backend"] is None and line["attempts"] == 0 for line in lines)
    assert proxy.lb_status()["backends"][0]["served"] == 0  # nothing reached the card


def test_relaxed_contract_fixes_the_request_and_the_card_answers(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], contract={"mode": "relaxed"})
    r = proxy.chat({**body(user=777), "enable_thinking": False})
    assert r.status_code == 200, r.text
    assert r.headers["X-Backend"] == f"127.0.0.1:{sim.port}"
    assert proxy.results(count=1)[0]["orid"] == "777"


def test_large_and_chunked_bodies_arrive_whole_and_chunked_ones_are_limited_too(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], max_body_bytes=8 * 1024 * 1024)
    png = io.BytesIO()
    Image.effect_noise((1200, 1200), 64).convert("RGB").save(png, "PNG")  # noise: megabytes, many reads
    payload = body(text="")
    image = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    payload["messages"][0]["content"] = [{"type": "image_url", "image_url": {"url": image}},
                                         {"type": "text", "text": "Read the invoice number."}]
    raw = json.dumps(payload).encode()
    assert len(raw) > 2 * 1024 * 1024
    assert proxy.chat(raw).status_code == 200  # a truncated body would be a JSON error (400)

    def chunked(data: bytes, size: int = 65536):
        return (data[i:i + size] for i in range(0, len(data), size))

    headers = {"Content-Type": "application/json"}
    r = requests.post(proxy.url + "/v1/chat/completions", data=chunked(raw), headers=headers, timeout=30)
    assert r.status_code == 200
    r = requests.post(proxy.url + "/v1/chat/completions", data=chunked(b" " * (9 * 1024 * 1024)), headers=headers,
                      timeout=30)
    assert r.status_code == 413 and f"{8 * 1024 * 1024} bytes" in r.json()["error"]["message"]
    assert [line["status"] for line in proxy.results(count=3)] == [200, 200, 413]


def test_a_compressed_body_is_decoded_and_a_broken_one_is_a_400(proxy):
    raw = json.dumps(body()).encode()
    r = proxy.chat(gzip.compress(raw), headers={"Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text  # forwarded decoded, without the Content-Encoding it no longer has
    r = proxy.chat(raw, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and r.headers["X-Backend"] == "dcu-proxy"
    assert "could not be read" in r.json()["error"]["message"] and "Content-Encoding" in r.json()["error"]["message"]
    assert [line["status"] for line in proxy.results(count=2)] == [200, 400]


def test_malformed_http_is_a_400_and_one_warning_line_not_a_traceback(proxy):
    heads = [b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
             b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"]
    for head in heads:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
            conn.sendall(head)
            assert conn.recv(64).split(b" ")[1] == b"400"
    assert proxy.chat(b"not gzip", headers={"Content-Encoding": "gzip"}).status_code == 400

    def warnings():
        lines = [line for line in proxy.log.read_text().splitlines() if "malformed HTTP request" in line]
        return lines if len(lines) == 3 else None

    lines = wait_until(warnings, what="a warning for each malformed request")
    assert all(" WARNING aiohttp.server: " in line for line in lines), lines
    assert [kind for kind in ("LineTooLong", "Duplicate 'Content-Type'", "ContentEncodingError")
            if not any(kind in line for line in lines)] == []
    log = proxy.log.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log


def test_a_body_that_stops_coming_is_a_408_at_the_deadline(start_sim, start_proxy):
    sim = start_sim(*FAST)
    proxy = start_proxy([sim.url], request_timeout=1)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")  # and then nothing more
        answer = b""
        while not answer.endswith(b"}}") and (chunk := conn.recv(65536)):  # the envelope ends the answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"did not arrive within the proxy's 1 s deadline" in answer and b'"RequestTimeoutError"' in answer
    assert proxy.results(count=1)[0]["status"] == 408


def test_a_long_numeric_orid_survives_exactly():
    orid = 123456789012345678901234567890  # beyond 64 bits: a float to some JSON parsers
    call = check({"model": SERVED_MODEL, "user": orid, "seed": orid, "messages": []}, RELAXED)
    assert call.orid == str(orid)
    assert json.loads(call.body) == {"model": SERVED_MODEL, "user": str(orid), "seed": orid, "messages": []}


def test_a_request_rewritten_with_a_lone_surrogate_stays_valid_json():
    payload = {"model": SERVED_MODEL, "user": 7, "messages": [{"role": "user", "content": "\ud800 from JSON"}]}
    call = check(payload, RELAXED, raw=json.dumps(payload).encode())
    assert json.loads(call.body)["messages"][0]["content"] == "\ud800 from JSON"
