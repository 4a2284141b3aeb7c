"""Who a serving host answers behind a gateway, as a play works it out: a real ansible-playbook run of dcu_proxy's
exports on a local host of an inventory with a gateway. The settings come from the gateway's inventory vars alone;
a gateway the serving hosts cannot tell fails the play naming it and the variable; the secret is never shown. The
host's API follows the gateway's TLS: plain HTTP on the network only where the inventory says so."""

from __future__ import annotations

import sys
from pathlib import Path

from support import local_play

SECRET = "gw-trust-secret-0123456789"


CA = "-----BEGIN CERTIFICATE-----\nMIIBsite\n-----END CERTIFICATE-----\n"  # what the exports pass on, unread


# dcu_proxy's exports on the serving host, and what they set
PLAY = [{"hosts": "dcu_nodes", "gather_facts": False, "tasks": [
    {"name": "Exports", "ansible.builtin.include_role": {"name": "dcu.serving.dcu_proxy", "tasks_from": "exports",
                                                        "public": True}},
    {"name": "Show", "ansible.builtin.debug": {"msg": {
        "url": "{{ dcu_proxy_gateway_url }}", "allow": "{{ dcu_proxy_gateway_allow }}",
        "secret_set": "{{ dcu_proxy_gateway_secret == '" + SECRET + "' }}",
        "headers_set": "{{ dcu_proxy_api_headers == {'Authorization': 'Bearer " + SECRET + "'} }}",
        "public_url": "{{ dcu_proxy_public_url }}", "local_url": "{{ dcu_proxy_url }}",
        "public_ca": "{{ dcu_proxy_public_ca }}"}}},
]}]


def run(tmp_path: Path, gateway: dict, node: dict | None = None) -> tuple[int, str, list]:
    """(return code, whole output, the results of the play's tasks on the serving host)."""
    node = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False,
            "ansible_host": "10.20.0.11", **(node or {})}
    return local_play(tmp_path, {"all": {"children": {"dcu_nodes": {"hosts": {"node": node}},
                                                      "dcu_gateways": {"hosts": {"gw1": gateway}}}}}, PLAY)


def test_a_serving_host_answers_the_gateway_of_the_inventory_and_presents_its_secret_itself(tmp_path):
    gateway = {"ansible_host": "10.20.0.5", "dcu_gateway_proxy_secret": SECRET, "dcu_gateway_tls_ca": CA}
    code, out, results = run(tmp_path, gateway, {"dcu_proxy_tls_cert": "cert", "dcu_proxy_tls_key": "key"})
    assert code == 0, out
    # The gateway's TLS is site (its default): the host's API too, with its certificate from the vault, verified with
    # the site CA; plain HTTP on loopback only.
    assert results[-1]["msg"] == {"url": "https://10.20.0.5:4000", "allow": ["10.20.0.5"], "secret_set": True,
                                  "headers_set": True, "public_url": "https://10.20.0.11:8443",
                                  "local_url": "http://127.0.0.1:8000", "public_ca": CA}
    assert SECRET not in out


def test_plain_http_on_the_hosts_network_only_where_the_inventory_says_so(tmp_path):
    gateway = {"ansible_host": "10.20.0.5", "dcu_gateway_proxy_secret": SECRET, "dcu_gateway_tls_ca": CA}
    code, out, results = run(tmp_path, dict(gateway, dcu_gateway_tls="off"))
    assert code == 0, out
    assert results[-1]["msg"]["public_url"] == "http://10.20.0.11:8000" and results[-1]["msg"]["public_ca"] == ""
    code, out, results = run(tmp_path, gateway, {"dcu_proxy_tls": "off"})
    assert code == 0, out
    assert results[-1]["msg"]["url"] == "https://10.20.0.5:4000"
    assert results[-1]["msg"]["public_url"] == "http://10.20.0.11:8000"

    # A site gateway's hosts without a certificate, or with plain HTTP on the network beside TLS: named at once.
    code, out, results = run(tmp_path, gateway)
    assert code != 0 and results[-1]["failed"]
    assert ("node: dcu_proxy_tls is site (the gateways' dcu_gateway_tls) but dcu_proxy_tls_cert or dcu_proxy_tls_key "
            "is empty: put this host's certificate and key in ansible-vault (host_vars), or set dcu_proxy_tls: lab "
            "for a lab, or off to keep plain HTTP on the hosts' network") in " ".join(results[-1]["msg"].split())
    code, out, results = run(tmp_path, gateway, {"dcu_proxy_tls": "lab", "dcu_proxy_listen": "0.0.0.0:8000"})
    assert code != 0
    assert ("node: dcu_proxy_listen 0.0.0.0:8000 takes plain HTTP from the network while the API is on TLS "
            "(0.0.0.0:8443): set dcu_proxy_listen to 127.0.0.1:PORT") in " ".join(results[-1]["msg"].split())
    assert SECRET not in out


def test_a_gateway_the_serving_hosts_cannot_tell_fails_the_play_naming_it_and_the_variable(tmp_path):
    code, out, results = run(tmp_path, {"ansible_host": "gw1.example", "dcu_gateway_proxy_secret": SECRET})
    assert code != 0 and results[-1]["failed"]
    assert "the gateway gw1 calls them from: its ansible_host 'gw1.example' is not an IP address; set " \
           "dcu_gateway_source_addresses in its host vars" in " ".join(results[-1]["msg"].split())
    assert SECRET not in out

    code, out, results = run(tmp_path, {"ansible_host": "10.20.0.5", "dcu_gateway_proxy_secret": "short"})
    assert code != 0
    assert "dcu_gateway_proxy_secret of the gateway gw1: missing or shorter than 16 characters" in \
        " ".join(results[-1]["msg"].split())
