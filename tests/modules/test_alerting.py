"""What role dcu_alertmanager works out (plugin_utils/alerting.py): the problems of its settings, each naming the
variable and never a secret; the configuration and the files its secrets go in; the silences and the failure alert
the plays that change a host send; where each monitoring host's Alertmanager answers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ansible_collections.dcu.serving.plugins.module_utils.addresses import ListenError
from ansible_collections.dcu.serving.plugins.plugin_utils.alerting import (
    alertmanager_config,
    alertmanager_problems,
    alertmanager_secret_files,
    alertmanager_urls,
    change_alert,
    change_silence,
)
from ansible_collections.dcu.serving.plugins.plugin_utils.topology import monitoring_hosts

TOKEN = "bearer-token-0123456789"
PASSWORD = "smtp-password-0123456789"
RECEIVERS = [{"name": "oncall", "webhooks": [{"url": "https://pager.example/hook", "bearer_token": TOKEN},
                                            {"url": "http://10.0.0.5:9099/alerts"}]},
             {"name": "team", "emails": ["a@example.com", "b@example.com"]}]
SMTP = {"smarthost": "mail.example:587", "from": "am@example.com", "username": "am", "password": PASSWORD}


def test_good_settings_have_no_problem():
    assert alertmanager_problems(RECEIVERS, SMTP, "team", [{"receiver": "oncall", "matchers": ['severity="critical"']}],
                                 {"group_wait": "30s", "repeat_interval": "4h"}) == []


def test_each_problem_names_the_variable_and_never_a_secret():
    problems = alertmanager_problems(
        [{"name": "oncall", "webhooks": [{"url": "pager.example/hook", "bearer_token": TOKEN}], "sms": ["1"]},
         {"name": "oncall", "emails": ["not-an-address"]},
         {"name": "silent"},
         "team",
         {"name": "empty-token", "webhooks": [{"url": "https://x/y", "bearer_token": " "}]}],
        {"password": PASSWORD}, "nobody",
        [{"receiver": "pager", "matchers": []}],
        {"group_wait": "soon"})
    assert problems == [
        "dcu_alertmanager_receivers[0] (oncall): unknown key(s) sms; a receiver takes name, webhooks, emails",
        "dcu_alertmanager_receivers[0] (oncall).webhooks[0]: needs url: http(s)://HOST[:PORT]/PATH",
        "dcu_alertmanager_receivers[1] (oncall).emails[0]: not an e-mail address",
        "dcu_alertmanager_receivers[2] (silent): give webhooks ([{url, bearer_token?}]) or emails ([address]), or both",
        "dcu_alertmanager_receivers[3]: needs a name and webhooks or emails",
        "dcu_alertmanager_receivers[4] (empty-token).webhooks[0].bearer_token: empty; give the token (ansible-vault) "
        "or leave the key out",
        "dcu_alertmanager_receivers: each name once (routes name receivers)",
        "dcu_alertmanager_smtp: a receiver sends e-mail; give smarthost (HOST:PORT of the mail relay, e.g. "
        "mail.example.internal:587) and from (the sender's address)",
        "dcu_alertmanager_smtp: a password needs its username",
        "dcu_alertmanager_receiver: 'nobody' is no receiver's name (receivers: oncall, oncall, silent, empty-token)",
        "dcu_alertmanager_routes[0].receiver: 'pager' is no receiver's name (receivers: oncall, oncall, silent, "
        "empty-token)",
        "dcu_alertmanager_routes[0].matchers: a list of label matchers, e.g. ['severity=\"critical\"']",
        "dcu_alertmanager_group_wait: 'soon' is no duration; write e.g. 30s, 5m, 4h",
    ]
    assert not any(TOKEN in p or PASSWORD in p for p in problems)


def test_no_receiver_is_a_problem_that_says_alerts_would_reach_nobody():
    assert alertmanager_problems([], {})[0].startswith("dcu_alertmanager_receivers: empty; alerts would reach nobody")


def test_the_configuration_names_the_secrets_files_and_the_files_hold_them():
    config = alertmanager_config(RECEIVERS, SMTP, "", [], {"send_resolved": False}, "/etc/s")
    assert TOKEN not in repr(config) and PASSWORD not in repr(config)
    assert config["route"]["receiver"] == "oncall"  # the first receiver when none is named
    assert config["global"]["smtp_auth_password_file"] == "/etc/s/smtp-password"
    hooks = config["receivers"][0]["webhook_configs"]
    assert hooks[0]["http_config"]["authorization"] == {"type": "Bearer",
                                                        "credentials_file": "/etc/s/webhook-0-oncall-0.token"}
    assert "http_config" not in hooks[1] and hooks[1]["send_resolved"] is False
    assert config["receivers"][1]["email_configs"] == [{"to": "a@example.com", "send_resolved": False},
                                                       {"to": "b@example.com", "send_resolved": False}]
    assert alertmanager_secret_files(RECEIVERS, SMTP, "/etc/s") == [
        {"path": "/etc/s/webhook-0-oncall-0.token", "content": TOKEN + "\n"},
        {"path": "/etc/s/smtp-password", "content": PASSWORD}]


def test_routes_come_in_order_and_extra_inhibitions_after_those_of_a_dcu_host():
    extra = {"source_matchers": ['alertname="X"'], "target_matchers": ['alertname="Y"'], "equal": ["host"]}
    config = alertmanager_config(RECEIVERS, SMTP, "team", [
        {"receiver": "oncall", "matchers": ['severity="critical"'], "continue": True},
        {"receiver": "team", "matchers": ['alertname="DCUChangeFailed"'], "group_by": ["host"]}],
        {"group_by": ["host"], "group_wait": "1s"}, "/etc/s", [extra])
    assert config["route"] == {
        "receiver": "team", "group_by": ["host"], "group_wait": "1s", "group_interval": "5m", "repeat_interval": "4h",
        "routes": [{"receiver": "oncall", "matchers": ['severity="critical"'], "continue": True},
                   {"receiver": "team", "matchers": ['alertname="DCUChangeFailed"'], "group_by": ["host"]}]}
    assert config["inhibit_rules"][0]["source_matchers"] == ['alertname="HostDown"']
    assert config["inhibit_rules"][-1] == extra


def test_a_silence_matches_every_label_and_ends_at_the_changes_bound():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    body = change_silence({"unit": "vllm@3", "host": "node-01"}, 1800, "dcu.serving serving.yml", "vllm@3 restarts",
                          now=now)
    assert body == {
        "matchers": [{"name": "host", "value": "node-01", "isRegex": False, "isEqual": True},
                     {"name": "unit", "value": "vllm@3", "isRegex": False, "isEqual": True},
                     {"name": "alertname", "value": "DCUChangeFailed", "isRegex": False, "isEqual": False}],
        "startsAt": "2026-01-02T03:03:05.000000Z", "endsAt": "2026-01-02T03:34:05.000000Z",
        "createdBy": "dcu.serving serving.yml", "comment": "vllm@3 restarts"}


@pytest.mark.parametrize("labels", [{}, {"unit": ""}, {"bad-name": "x"}])
def test_a_silence_that_would_match_too_much_or_nothing_is_refused(labels):
    with pytest.raises(ValueError, match="a silence needs label names and non-empty values"):
        change_silence(labels, 60, "me", "why")


def test_the_failure_alert_fires_for_its_time_with_its_labels():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    alerts = change_alert({"alertname": "DCUChangeFailed", "host": "node-01", "unit": "", "severity": "warning"},
                          "vllm@0 failed", "why", 3600, now=now)
    assert alerts == [{"labels": {"alertname": "DCUChangeFailed", "host": "node-01", "severity": "warning"},
                       "annotations": {"summary": "vllm@0 failed", "description": "why"},
                       "startsAt": "2026-01-02T03:04:05.000000Z", "endsAt": "2026-01-02T04:04:05.000000Z"}]


def test_the_monitoring_hosts_are_their_group_else_the_first_serving_host():
    assert monitoring_hosts({"dcu_nodes": ["a", "b"], "dcu_monitoring": ["mon"]}) == ["mon"]
    assert monitoring_hosts({"dcu_nodes": ["a", "b"]}) == ["a"]
    assert monitoring_hosts({"gpu": ["g1"]}, "gpu") == ["g1"]
    assert monitoring_hosts({}) == []


def test_where_each_alertmanager_answers_exported_else_from_its_inventory():
    hostvars = {"mon": {"dcu_alertmanager_url": "http://127.0.0.1:19093"},
                "mon2": {"dcu_alertmanager_listen": "0.0.0.0:9193"},
                "mon3": {}}
    assert alertmanager_urls(["mon", "mon2", "mon3"], hostvars, "127.0.0.1:9093") == {
        "mon": "http://127.0.0.1:19093", "mon2": "http://127.0.0.1:9193", "mon3": "http://127.0.0.1:9093"}
    with pytest.raises(ListenError, match="dcu_alertmanager_listen of mon3"):
        alertmanager_urls(["mon3"], hostvars, "9093")
