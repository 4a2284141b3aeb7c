# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What connects to what: a host's dcu-proxy backends from its vLLM instances (and MinerU behind its entrance), and
across the fleet the addresses each host's pieces are reached at (Prometheus' targets, the gateway's hosts) from the
facts each role exports. Every list here is built from exported facts, never from another role's defaults."""

import ipaddress
from urllib.parse import urlsplit

from ansible.errors import AnsibleFilterError
from ansible.utils.display import Display

from ansible_collections.dcu.serving.plugins.module_utils.addresses import (
    ListenError,
    is_loopback,
    local_url,
    reachable_elsewhere,
    url_host,
)

display = Display()


def proxy_backends(instances):
    """dcu-proxy's `backends` in the model-services form: one entry per instance, {url, models, kind,
    concurrency (its --max-num-seqs), max_model_len}, in instance order (docs/proxy.md)."""
    backends = []
    for instance in instances or []:
        entry = {"url": instance["url"], "models": list(instance.get("models") or [instance.get("model")]),
                 "kind": instance.get("kind") or "chat"}
        if instance.get("max_num_seqs"):
            entry["concurrency"] = int(instance["max_num_seqs"])
        if instance.get("max_model_len"):
            entry["max_model_len"] = int(instance["max_model_len"])
        backends.append(entry)
    return backends


def exporter_card_units(instances):
    """{"<card index>": unit} over every card of every instance: the exporter labels a card's metrics with the unit
    of the instance on it (the `unit` label Prometheus gives that instance's own metrics)."""
    units = {}
    for instance in instances or []:
        for card in instance.get("cards") or [instance.get("card")]:
            units[str(card)] = instance["unit"]
    return units


def facts_by_host(hosts, hostvars, name, missing=None):
    """{host: hostvars[host][name]} for each host, `missing` where the host has no such fact."""
    return dict((host, hostvars.get(host, {}).get(name, missing)) for host in hosts or [])


def _exported(hostvars, host, name, role, entry):
    """A fact `name` that role `role` exports on `host`, or an error saying how to have it exported."""
    facts = hostvars.get(host, {})
    if name not in facts:
        raise AnsibleFilterError(
            "{} of {} is unknown in this run: {} exports it (its tasks_from: {}) in a play on that host before this "
            "one; run the playbook without --limit, or over every serving host".format(name, host, role, entry))
    return facts[name]


def _target(url):
    """host:port of a URL, as Prometheus' static_configs take it ([::1]:9400 for IPv6)."""
    return urlsplit(url).netloc


MONITORING_GROUP = "dcu_monitoring"


def monitoring_hosts(groups, serving_group="dcu_nodes"):
    """The hosts that run Prometheus and Alertmanager (playbooks/monitoring.yml) and that the plays changing a serving
    host ask for silences: the `dcu_monitoring` group, else the first serving host."""
    chosen = list((groups or {}).get(MONITORING_GROUP) or [])
    if chosen:
        return chosen
    serving = list((groups or {}).get(serving_group) or [])
    return serving[:1]


def prometheus_targets(hosts, hostvars, here):
    """The scrape targets per job, [{targets, labels}] as Prometheus' static_configs take them: every serving host's
    dcu-exporter, vLLM instances and dcu-proxy, at the addresses their roles export - the local ones when the host
    is `here` (Prometheus' own host), the public ones otherwise. Every target carries `host`, the vLLM instances
    their `unit` (what to restart). A piece of another host that listens on loopback only (dcu-exporter's default)
    is scraped at that host's address all the same - its target shows down, its alert fires - and a warning says
    how to make it reachable. A dcu-proxy another host reaches over TLS is scraped with `__scheme__: https` (the job
    verifies it with the hosts' CA, prometheus_ca)."""
    jobs = {"dcu-exporter": [], "vllm": [], "dcu-proxy": []}
    for host in hosts or []:
        local = host == here
        address = None if local else str(hostvars[host].get("ansible_host") or host)
        for job, role, fact in (("dcu-exporter", "dcu_monitoring", "dcu_monitoring_exporter_url"),
                                ("dcu-proxy", "dcu_proxy", "dcu_proxy_url")):
            url = _exported(hostvars, host, fact if local else fact.replace("_url", "_public_url"), role, "exports")
            target = _target(url)
            if not local and not reachable_url(url):
                target = "{}:{}".format(url_host(address), urlsplit(url).port)
                display.warning(
                    "{job} of {host} is {url}: it listens on loopback only, so Prometheus on {here} cannot scrape it "
                    "at {target}; make it listen where {here} reaches it (e.g. {listen}: 0.0.0.0:PORT) or run "
                    "Prometheus on {host}".format(job=job, host=host, url=url, here=here, target=target,
                                                  listen=fact[:-len("_url")] + "_listen"))
            labels = {"host": host}
            if urlsplit(url).scheme == "https":  # a host behind a gateway with TLS (dcu_proxy_tls)
                labels["__scheme__"] = "https"
            jobs[job].append({"targets": [target], "labels": labels})
        for instance in _exported(hostvars, host, "dcu_vllm_instances", "dcu_vllm", "instances"):
            target = _target(instance["url"]) if local else "{}:{}".format(url_host(address), instance["port"])
            jobs["vllm"].append({"targets": [target], "labels": {"host": host, "unit": instance["unit"]}})
    return jobs


def prometheus_expected_cards(hosts, hostvars):
    """{host: the cards it must show} (dcu_vllm exports dcu_vllm_card_count), for the CardMissing alert."""
    return dict((host, int(_exported(hostvars, host, "dcu_vllm_card_count", "dcu_vllm", "instances")))
                for host in hosts or [])


def gateway_hosts(hosts, hostvars):
    """The serving hosts as the gateway reaches them, [{name, url, models, kinds}]: each host's dcu-proxy at its
    exported public URL (dcu_proxy_public_url), or at its dcu_gateway_address host variable with the proxy's port,
    serving the models its dcu_vllm exports (dcu_vllm_models) of the kinds it exports (dcu_vllm_model_kinds), and
    `mineru` ({max_upload_mb, timeout}) where its dcu-proxy is MinerU's entrance (dcu_mineru's export
    dcu_mineru_proxy_entrance, read on hosts that run MinerU)."""
    out = []
    for host in hosts or []:
        url = _exported(hostvars, host, "dcu_proxy_public_url", "dcu_proxy", "exports")
        override = hostvars[host].get("dcu_gateway_address")
        if override:
            url = "{}://{}:{}".format(urlsplit(url).scheme, url_host(str(override)), urlsplit(url).port)
        elif not reachable_url(url):
            raise AnsibleFilterError(
                "dcu-proxy of {} listens on loopback only ({}): the gateway cannot reach it; set dcu_proxy_listen to "
                "an address the gateway reaches (e.g. 0.0.0.0:8000), or dcu_gateway_address in its host vars".format(
                    host, url))
        entry = {"name": host, "url": url,
                 "models": list(_exported(hostvars, host, "dcu_vllm_models", "dcu_vllm", "exports")),
                 "kinds": dict(_exported(hostvars, host, "dcu_vllm_model_kinds", "dcu_vllm", "exports"))}
        # MinerU's API at the host's entrance (dcu_mineru's export, on hosts that run it: dcu_mineru_vlm_model)
        entrance = hostvars[host].get("dcu_mineru_proxy_entrance") or {}
        if entrance:
            entry["mineru"] = {"max_upload_mb": entrance.get("max_upload_mb"), "timeout": entrance.get("timeout")}
        out.append(entry)
    return out


def reachable_url(url):
    """Whether a URL names a host other hosts can reach (not loopback)."""
    return not is_loopback(urlsplit(url).hostname or "")


def _gateway_sources(name, facts):
    """The addresses or networks a gateway calls the serving hosts from, checked."""
    sources = facts.get("dcu_gateway_source_addresses")
    if sources is None:
        address = str(facts.get("ansible_host") or "")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise AnsibleFilterError(
                "the serving hosts cannot tell which address the gateway {} calls them from: its ansible_host {!r} is "
                "not an IP address; set dcu_gateway_source_addresses in its host vars (e.g. ['10.20.0.5'])".format(
                    name, address or name)) from None
        sources = [address]
    if isinstance(sources, str) or not sources:
        raise AnsibleFilterError("dcu_gateway_source_addresses of {}: a non-empty list of addresses or networks, got "
                                 "{!r}".format(name, sources))
    for source in sources:
        try:
            ipaddress.ip_network(str(source), strict=False)
        except ValueError:
            raise AnsibleFilterError("dcu_gateway_source_addresses of {}: {!r} is not an IP address or network".format(
                name, source)) from None
    return [str(source) for source in sources]


def gateway_trust(gateways, hostvars, listen="0.0.0.0:4000"):
    """What a serving host needs to answer the API to its gateways only (dcu_proxy's gateway settings):
    {url, allow, secret, tls, tls_lab_dir, tls_ca}, or {} when the inventory has no gateway.

    gateways: the inventory's gateway hosts (group dcu_gateways); listen: dcu_gateway's own default listen, for a
    gateway whose vars do not set dcu_gateway_listen. `allow`: each gateway's dcu_gateway_source_addresses, else its
    ansible_host when that is an IP address; `url` (named in the 403 other callers get): dcu_gateway_public_url, else
    https://<dcu_gateway_vip, else ansible_host>:<its port> (http:// when its dcu_gateway_tls is off), once for
    gateways sharing it; `secret`: dcu_gateway_proxy_secret, one for all the gateways. Fails naming the gateway and
    the variable when one cannot be worked out. `tls`: the gateways' dcu_gateway_tls (one for all of them), which a
    host's TLS follows (the gateway's callers' keys are protected to the gateway, its secret and their prompts on to
    the host), with their dcu_gateway_tls_lab_dir and dcu_gateway_tls_ca (a site's CA, which the hosts' certificates
    may come from too)."""
    if not gateways:
        return {}
    allow, urls, secrets, modes = [], [], {}, {}
    for name in gateways:
        facts = hostvars.get(name, {})
        for source in _gateway_sources(name, facts):
            if source not in allow:
                allow.append(source)
        port = str(facts.get("dcu_gateway_listen") or listen).rsplit(":", 1)[-1]
        scheme = "http" if facts.get("dcu_gateway_tls") == "off" else "https"  # dcu_gateway_tls defaults to site
        where = facts.get("dcu_gateway_vip") or facts.get("ansible_host") or name  # the floating address first
        url = str(facts.get("dcu_gateway_public_url") or "{}://{}:{}".format(scheme, url_host(str(where)), port))
        if url not in urls:  # gateways behind one floating address share it
            urls.append(url)
        secret = str(facts.get("dcu_gateway_proxy_secret") or "")
        if len(secret) < 16:
            raise AnsibleFilterError(
                "dcu_gateway_proxy_secret of the gateway {}: missing or shorter than 16 characters; the serving hosts "
                "believe the gateway by it - put a long random one in ansible-vault, in the gateways' group "
                "vars".format(name))
        secrets.setdefault(secret, name)
        modes.setdefault(str(facts.get("dcu_gateway_tls") or "site"), name)
    if len(modes) > 1:
        raise AnsibleFilterError("dcu_gateway_tls differs between the gateways ({}): callers reach them at one address "
                                 "and the serving hosts follow one setting; give every gateway the same".format(
                                     ", ".join("{} {}".format(name, mode) for mode, name in modes.items())))
    if len(secrets) > 1:
        raise AnsibleFilterError("dcu_gateway_proxy_secret differs between the gateways {}: a serving host checks one "
                                 "secret; give every gateway the same".format(" and ".join(secrets.values())))
    first = hostvars.get(gateways[0], {})
    return {"url": " or ".join(urls), "allow": allow, "secret": next(iter(secrets)), "tls": next(iter(modes)),
            "tls_lab_dir": first.get("dcu_gateway_tls_lab_dir"), "tls_ca": str(first.get("dcu_gateway_tls_ca") or "")}


MINERU_ENTRANCES = ("own", "proxy")


def _whole(value, name, low=1):
    """An inventory value that must be a whole number >= low, or an error naming its variable."""
    try:
        number = int(str(value))
    except ValueError:
        number = None
    if number is None or number < low:
        raise AnsibleFilterError("{} is {!r}: give a whole number of at least {}".format(name, value, low))
    return number


def proxy_mineru(entrance, listen, max_upload_mb, workers, queue_size, timeout):
    """dcu-proxy's `mineru` section for a host whose MinerU API comes through the proxy's entrance
    (`dcu_mineru_entrance: proxy`): {url, max_upload_mb, concurrency, queue_size, timeout} - MinerU where the host
    reaches it (from dcu_mineru_listen), its upload limit, its workers as the parses in flight, the entrance's queue
    and deadline; {} for `own` (MinerU on its own port only). Fails naming the variable and the fix: an entrance
    other than own or proxy, or MinerU listening beyond loopback while the proxy is its entrance (its callers would
    pass by the proxy's trust and limits; MinerU has no authentication)."""
    if entrance not in MINERU_ENTRANCES:
        raise AnsibleFilterError(
            "dcu_mineru_entrance is {!r}: choose own (MinerU's API on dcu_mineru_listen only) or proxy (on dcu-proxy's "
            "port too, under /mineru/, with the API's callers, limits and metrics)".format(entrance))
    try:
        url = local_url(listen, what="dcu_mineru_listen")
        reachable = reachable_elsewhere(listen, what="dcu_mineru_listen")
    except ListenError as e:
        raise AnsibleFilterError(str(e)) from None
    section = {"url": url, "max_upload_mb": _whole(max_upload_mb, "dcu_mineru_max_upload_mb"),
               "concurrency": _whole(workers, "dcu_mineru_workers"),
               "queue_size": _whole(queue_size, "dcu_mineru_entrance_queue", 0),
               "timeout": _whole(timeout, "dcu_mineru_parse_timeout")}
    if entrance == "own":
        return {}
    if reachable:
        raise AnsibleFilterError(
            "dcu_mineru_entrance is proxy but dcu_mineru_listen {} takes calls from the network, past dcu-proxy's "
            "callers and limits (MinerU has no authentication): set dcu_mineru_listen to 127.0.0.1:{}, or "
            "dcu_mineru_entrance: own".format(listen, url.rsplit(":", 1)[1]))
    return section
