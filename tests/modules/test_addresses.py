"""HOST:PORT to the URL a client uses, written once (module_utils/addresses.py) for the roles' exports,
cluster_health and dcu-doctor: wildcards, loopback, IPv6 and bad input."""

from __future__ import annotations

import pytest

from ansible_collections.dcu.serving.plugins.module_utils.addresses import (
    ListenError,
    local_url,
    public_url,
    reachable_elsewhere,
    split_listen,
)


@pytest.mark.parametrize("listen, url", [
    ("0.0.0.0:8000", "http://127.0.0.1:8000"),
    (":9400", "http://127.0.0.1:9400"),  # every IPv4 interface
    ("127.0.0.1:9090", "http://127.0.0.1:9090"),
    ("10.0.0.5:9000", "http://10.0.0.5:9000"),
    ("[::]:8000", "http://[::1]:8000"),  # an IPv6 wildcard socket may refuse IPv4 (bindv6only)
    ("[::1]:8001", "http://[::1]:8001"),
    ("[fd00::5]:8000", "http://[fd00::5]:8000"),
    ("node-a:8000", "http://node-a:8000"),
])
def test_the_url_a_client_on_the_host_uses(listen, url):
    assert local_url(listen) == url


@pytest.mark.parametrize("listen, url, elsewhere", [
    ("0.0.0.0:9000", "http://10.0.0.11:9000", True),
    ("[::]:9000", "http://10.0.0.11:9000", True),
    ("10.0.0.99:9000", "http://10.0.0.99:9000", True),  # it listens there, whatever the inventory says
    ("127.0.0.1:9400", "http://127.0.0.1:9400", False),  # nobody else reaches it
])
def test_the_url_other_hosts_use(listen, url, elsewhere):
    assert public_url(listen, "10.0.0.11") == url
    assert reachable_elsewhere(listen) is elsewhere


def test_an_ipv6_inventory_address_is_bracketed():
    assert public_url("0.0.0.0:8000", "fd00::11") == "http://[fd00::11]:8000"


@pytest.mark.parametrize("listen", ["8000", "0.0.0.0", "0.0.0.0:0", "0.0.0.0:70000", "::1:8000", "", None,
                                    "0.0.0.0:80a"])
def test_what_is_not_host_port_is_refused_naming_the_variable(listen):
    with pytest.raises(ListenError, match=r"dcu_proxy_listen is .*: give HOST:PORT with a port of 1-65535"):
        split_listen(listen, "dcu_proxy_listen")
