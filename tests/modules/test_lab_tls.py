"""dcu.serving.lab_tls: a lab CA and a server certificate that a caller verifying with the CA accepts."""

from __future__ import annotations

import json
import socket
import ssl
import stat
import threading

import pytest

from dcu_serving.gateway import tls_check


def _tls_server(result):
    """A TLS server on loopback presenting the certificate to one connection; returns (port, thread)."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(result["cert"], result["key"])
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client refused the certificate: that is its answer
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def _handshake(result, name, connect_as):
    """A real TLS handshake on loopback: the server presents the certificate, the client verifies it with the CA
    and the name it was asked for. Returns the client's view of the peer certificate, or raises SSLError."""
    port, thread = _tls_server(result)
    client_ctx = ssl.create_default_context(cafile=result["ca"])
    try:
        with (socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
              client_ctx.wrap_socket(raw, server_hostname=connect_as) as tls):
            return tls.getpeercert()
    finally:
        thread.join(10)


def test_the_lab_ca_signs_a_certificate_callers_verify_by_name_and_by_address(tmp_path, module_runner):
    names = ["gateway.lab.internal", "10.0.0.5", "127.0.0.1"]
    made = module_runner("lab_tls", {"dir": str(tmp_path / "tls"), "name": "gateway", "names": names})
    assert made["changed"] is True and made["made"] == ["ca", "gateway"], made
    assert stat.S_IMODE((tmp_path / "tls" / "gateway.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "tls" / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    peer = _handshake(made, "gateway", "gateway.lab.internal")
    assert ("DNS", "gateway.lab.internal") in peer["subjectAltName"]
    assert _handshake(made, "gateway", "127.0.0.1")  # an address in the certificate verifies too
    with pytest.raises(ssl.SSLCertVerificationError, match=r"match|mismatch"):
        _handshake(made, "gateway", "other.lab.internal")


def test_a_second_run_changes_nothing_and_new_names_remake_the_certificate_under_the_same_ca(tmp_path, module_runner):
    args = {"dir": str(tmp_path), "name": "gw1", "names": ["gw1.lab", "10.0.0.5"]}
    first = module_runner("lab_tls", args)
    ca_before = (tmp_path / "ca.pem").read_bytes()
    again = module_runner("lab_tls", args)
    assert again["changed"] is False and again["not_after"] == first["not_after"], again
    # A name added (a floating address): made again, the CA kept - callers' ca.pem stays valid.
    moved = module_runner("lab_tls", {**args, "names": ["gw1.lab", "10.0.0.5", "10.0.0.100"], "_ansible_diff": True})
    assert moved["changed"] is True and moved["made"] == ["gw1"], moved
    assert "10.0.0.100" in moved["reason"] and "10.0.0.100" in moved["diff"]["after"]
    assert (tmp_path / "ca.pem").read_bytes() == ca_before
    assert _handshake(moved, "gw1", "10.0.0.100")


def test_a_certificate_of_another_ca_is_replaced(tmp_path, module_runner):
    args = {"dir": str(tmp_path / "a"), "name": "gw", "names": ["gw.lab"]}
    module_runner("lab_tls", args)
    module_runner("lab_tls", {**args, "dir": str(tmp_path / "b")})
    (tmp_path / "a" / "gw.pem").write_bytes((tmp_path / "b" / "gw.pem").read_bytes())  # a stray copy
    fixed = module_runner("lab_tls", args)
    assert fixed["changed"] is True and fixed["reason"] == "not signed by this CA", fixed
    assert _handshake(fixed, "gw", "gw.lab")


def test_check_mode_says_what_it_would_make_and_writes_nothing(tmp_path, module_runner):
    result = module_runner("lab_tls", {"dir": str(tmp_path / "tls"), "name": "gw", "names": ["gw.lab"],
                                       "_ansible_check_mode": True})
    assert result["changed"] is True and result["made"] == ["ca", "gw"] and result["reason"] == "missing"
    assert not (tmp_path / "tls").exists()


def test_no_names_is_refused_naming_the_fix(tmp_path, module_runner):
    result = module_runner("lab_tls", {"dir": str(tmp_path), "name": "gw", "names": []})
    assert result["failed"] and "every name and address callers reach gw by" in result["msg"]


def test_the_gateways_check_verifies_as_callers_do_and_names_the_fix(tmp_path, module_runner, capsys):
    """dcu_serving.gateway.tls_check, which the role runs on the gateway: connects to loopback, verifies under the
    name callers use with their CA, and says how long the certificate has left."""
    made = module_runner("lab_tls", {"dir": str(tmp_path), "name": "gw", "names": ["gw.lab", "127.0.0.1"]})
    port, thread = _tls_server(made)
    assert tls_check.main(["--connect", f"127.0.0.1:{port}", "--name", "gw.lab", "--ca", made["ca"]]) == 0
    thread.join(10)
    shown = json.loads(capsys.readouterr().out)
    assert shown["names"] == ["gw.lab", "127.0.0.1"] and 820 <= shown["days_left"] <= 825
    port, thread = _tls_server(made)
    assert tls_check.main(["--connect", f"127.0.0.1:{port}", "--name", "llm.lab", "--ca", made["ca"]]) == 1
    thread.join(10)
    error = capsys.readouterr().err
    assert "does not verify for llm.lab" in error and "dcu_gateway_public_url" in error
