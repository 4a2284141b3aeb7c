# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""HOST:PORT (a listen address, as the roles' *_listen variables and proxy.yml hold it) to the URL a client
uses: on the host itself (local_url) or from another host (public_url). The one place this is worked out: the
roles' exports (plugins/filter/addresses.py), cluster_health and dcu-doctor (src/dcu_serving/addresses.py, a
symlink to this file) all call it. Standard library only, Python 3.6+ (it runs on the hosts, in the doctor).

A wildcard host listens everywhere: 0.0.0.0 (or an empty host, ":9400") is reached locally at 127.0.0.1, [::] at
[::1] (an IPv6 socket on [::] may refuse IPv4: net.ipv6.bindv6only). An IPv6 host is written in brackets in a
URL (http://[fd00::5]:8000)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# [IPv6]:PORT, or HOST:PORT where HOST has no colon (empty: every IPv4 interface).
_LISTEN = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]\s]*)):(?P<port>[0-9]{1,5})$")
IPV4_ANY = ("", "0.0.0.0", "*")
IPV6_ANY = ("::",)


class ListenError(ValueError):
    pass


def split_listen(listen, what="listen"):
    """(host, port) of HOST:PORT or [IPv6]:PORT; the host without brackets. Raises ListenError naming `what`."""
    match = _LISTEN.match(str(listen if listen is not None else "").strip())
    port = int(match.group("port")) if match else 0
    if not match or not 1 <= port <= 65535:
        raise ListenError("{} is {!r}: give HOST:PORT with a port of 1-65535, e.g. 0.0.0.0:8000, 127.0.0.1:9400, "
                          "[::]:8000 or :9400 (every interface)".format(what, listen))
    host = match.group("v6") if match.group("v6") is not None else match.group("host")
    return host, port


def is_wildcard(host):
    return host in IPV4_ANY or host in IPV6_ANY


def is_loopback(host):
    return host == "localhost" or host == "::1" or host.startswith("127.")


def url_host(host):
    """A host as a URL writes it: an IPv6 address in brackets."""
    return "[{}]".format(host) if ":" in host else host


def local_host(host):
    """Where a client on the same host reaches a listener on `host`."""
    if host in IPV6_ANY:
        return "::1"
    return "127.0.0.1" if host in IPV4_ANY else host


def local_url(listen, scheme="http", what="listen"):
    """The URL of a listener as the host itself reaches it: '0.0.0.0:8000' -> 'http://127.0.0.1:8000'."""
    host, port = split_listen(listen, what)
    return "{}://{}:{}".format(scheme, url_host(local_host(host)), port)


def public_url(listen, address, scheme="http", what="listen"):
    """The URL of a listener as another host reaches it: at `address` (the host's inventory address) when it
    listens everywhere, else at the address it listens on (which may be loopback: see reachable_elsewhere)."""
    host, port = split_listen(listen, what)
    return "{}://{}:{}".format(scheme, url_host(str(address) if is_wildcard(host) else host), port)


def reachable_elsewhere(listen, what="listen"):
    """Whether another host can reach a listener on `listen` at all (not when it listens on loopback only)."""
    return not is_loopback(split_listen(listen, what)[0])
