"""The API over TLS (`tls`): a listener of its own that a caller verifies with the CA, plain HTTP kept on `listen`,
a certificate and key that do not belong together refused by --check naming them, and a renewed certificate
served after a SIGHUP while a broken one keeps the running one."""

from __future__ import annotations

import datetime
import ipaddress
import re
import signal
import socket
import ssl
import subprocess
import sys

import pytest
import requests
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from proxy.proxytools import FAST, body

from dcu_serving.proxy import config as cfg
from support import free_port, wait_until


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sign(subject, public_key, issuer, signer, serial, ca=False):
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(public_key).serial_number(serial)
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
    return builder.sign(signer, hashes.SHA256())


class LabCA:
    """A CA in tmp_path and server certificates it signs for 127.0.0.1 and localhost."""

    def __init__(self, where):
        self.where = where
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.path = where / "ca.pem"
        self.path.write_bytes(_sign("test CA", self.key.public_key(), "test CA", self.key, 1, ca=True)
                              .public_bytes(serialization.Encoding.PEM))

    def issue(self, serial: int, stem: str = "proxy"):
        """(cert path, key path) of a new server certificate with this serial number."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert, key_path = self.where / f"{stem}.pem", self.where / f"{stem}.key"
        cert.write_bytes(_sign("dcu-proxy", key.public_key(), "test CA", self.key, serial)
                         .public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert, key_path


def served_serial(port: int, ca) -> int:
    """The serial number of the certificate the listener presents, verified with the CA."""
    context = ssl.create_default_context(cafile=str(ca))
    with (socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
          context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


@pytest.fixture
def lab(tmp_path):
    return LabCA(tmp_path)


def test_the_api_answers_over_tls_to_a_caller_verifying_the_ca_and_plain_http_stays_on_listen(
        start_sim, start_proxy, lab):
    sim = start_sim(*FAST)
    cert, key = lab.issue(2)
    port = free_port()
    proxy = start_proxy([sim.url], healthy=1, tls={"listen": f"127.0.0.1:{port}", "cert": str(cert), "key": str(key)})
    https = f"https://127.0.0.1:{port}"
    r = requests.post(https + "/v1/chat/completions", json=body(), verify=str(lab.path), timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["X-Backend"] == sim.url.removeprefix("http://")
    assert requests.get(https + "/__lb_status", verify=str(lab.path), timeout=5).json()["healthy"] == 1
    # A caller without the CA does not get through; plain HTTP is not spoken on the TLS port; `listen` still is.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(https + "/health", timeout=5)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)
    assert proxy.post("/v1/chat/completions", body()).status_code == 200


def test_check_refuses_a_key_of_another_certificate_and_an_unreadable_one_naming_them(tmp_path, lab):
    cert, _ = lab.issue(2, "one")
    _, other_key = lab.issue(3, "two")

    def check(key):
        path = tmp_path / "proxy.yml"
        path.write_text(yaml.safe_dump({"backends": ["http://127.0.0.1:8002"], "models": ["m"],
                                        "tls": {"listen": "0.0.0.0:8443", "cert": str(cert), "key": str(key)}}))
        return subprocess.run([sys.executable, "-m", "dcu_serving.proxy", "--check", "--config", str(path)],
                              capture_output=True, text=True, timeout=60)

    done = check(other_key)
    assert done.returncode == 2
    assert f"tls.key: {cert} and {other_key} are not a PEM certificate and its own key" in done.stderr
    done = check(tmp_path / "missing.key")
    assert done.returncode == 2
    assert f"tls.key: cannot read {tmp_path / 'missing.key'}: No such file or directory" in done.stderr
    assert "TLS on 0.0.0.0:8443" in check(tmp_path / "one.key").stdout


def test_the_tls_keys_go_together_and_need_a_port_of_their_own():
    base = {"backends": ["http://127.0.0.1:8002"], "models": ["m"]}
    with pytest.raises(cfg.ConfigError, match=r"tls.key: is required with the other tls keys \(missing: tls.key\)"):
        cfg.build({**base, "tls": {"listen": "0.0.0.0:8443", "cert": "/etc/dcu-serving/tls/proxy.pem"}})
    with pytest.raises(cfg.ConfigError, match=re.escape("tls.listen: 0.0.0.0:8000 has the port of listen")):
        cfg.build({**base, "tls": {"listen": "0.0.0.0:8000", "cert": "/a.pem", "key": "/a.key"}})


def test_a_reload_serves_a_renewed_certificate_and_keeps_the_running_one_when_the_new_pair_is_broken(
        start_sim, start_proxy, lab):
    sim = start_sim(*FAST)
    cert, key = lab.issue(2)
    port = free_port()
    proxy = start_proxy([sim.url], healthy=1, tls={"listen": f"127.0.0.1:{port}", "cert": str(cert), "key": str(key)})
    assert served_serial(port, lab.path) == 2
    lab.issue(3)  # renewed in place, as the role writes it
    proxy.signal(signal.SIGHUP)
    wait_until(lambda: served_serial(port, lab.path) == 3, 10, what="the renewed certificate served")
    # A certificate with another certificate's key: refused, the running pair goes on serving.
    renewed_key = key.read_bytes()
    lab.issue(4, "other")
    key.write_bytes((lab.where / "other.key").read_bytes())
    proxy.signal(signal.SIGHUP)
    wait_until(lambda: "keeping the running TLS certificate" in proxy.tail(), 10, what="the refusal logged")
    key.write_bytes(renewed_key)
    assert served_serial(port, lab.path) == 3
    r = requests.post(f"https://127.0.0.1:{port}/v1/chat/completions", json=body(), verify=str(lab.path), timeout=30)
    assert r.status_code == 200
