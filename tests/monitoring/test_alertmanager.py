"""dcu_alertmanager's generated configuration, without a host: the role's template rendered by ansible-playbook for the
test inventory (inventory.yml: the team's mail for every alert, a pager's webhook with a token for critical ones),
then checked by the package's own amtool - `check-config` (what the role's validate step runs) and
`config routes test` (which receiver an alert reaches). The inhibitions and the delivery itself are proved by the real
Alertmanager in molecule/default (tests/test_alerts.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.dcu.serving.plugins.plugin_utils.alerting import INHIBIT_RULES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SECRETS = "/etc/prometheus/alertmanager-secrets"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    from monitoring.test_prometheus import playbook  # tests/ is on pytest's pythonpath

    out = tmp_path_factory.mktemp("alertmanager")
    proc = playbook("render.yml", "-e", f"out={out}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def routes_test(amtool: str, config: Path, **labels) -> str:
    proc = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}",
                           *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_amtool_accepts_the_rendered_configuration(amtool, rendered):
    proc = subprocess.run([amtool, "check-config", str(rendered / "alertmanager.yml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    assert f" - {len(INHIBIT_RULES)} inhibit rules" in proc.stdout and " - 2 receivers" in proc.stdout, proc.stdout


def test_amtool_refuses_a_configuration_that_names_no_receiver(amtool, rendered, tmp_path):
    """What the role's validate step stops: a route to a receiver the file does not define."""
    config = yaml.safe_load((rendered / "alertmanager.yml").read_text())
    config["route"]["routes"][0]["receiver"] = "nobody"
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))
    proc = subprocess.run([amtool, "check-config", str(broken)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert 'undefined receiver "nobody"' in proc.stdout + proc.stderr


def test_critical_alerts_page_and_every_other_goes_to_the_default_receiver(amtool, rendered):
    config = rendered / "alertmanager.yml"
    assert routes_test(amtool, config, alertname="InstanceDown", host="node-a", unit="vllm@1",
                       severity="critical") == "pager"
    assert routes_test(amtool, config, alertname="DCUVRAMNearFull", host="node-a", severity="warning") == "team-mail"
    assert routes_test(amtool, config, alertname="DCUChangeFailed", host="node-b", severity="warning") == "team-mail"


def test_alerts_are_grouped_per_host_and_the_secrets_stay_in_their_files(rendered):
    text = (rendered / "alertmanager.yml").read_text()
    config = yaml.safe_load(text)
    assert config["route"]["group_by"] == ["alertname", "host"]
    assert config["inhibit_rules"] == INHIBIT_RULES
    # The configuration names the files; --diff of it shows no secret.
    assert "not-a-real-one" not in text
    hook = config["receivers"][1]["webhook_configs"][0]
    assert hook["url"] == "https://pager.example.internal/hooks/dcu" and hook["send_resolved"] is True
    token_file = hook["http_config"]["authorization"]["credentials_file"]
    assert token_file == f"{SECRETS}/webhook-1-pager-0.token"
    assert config["global"]["smtp_auth_password_file"] == f"{SECRETS}/smtp-password"
    assert config["global"]["smtp_smarthost"] == "mail.example.internal:587"
    assert config["receivers"][0] == {"name": "team-mail",
                                      "email_configs": [{"to": "dcu-team@example.com", "send_resolved": True}]}
    assert (rendered / "webhook-1-pager-0.token").read_text() == "pager-token-not-a-real-one\n"
    assert (rendered / "smtp-password").read_text() == "smtp-password-not-a-real-one"


def test_the_inhibitions_name_alerts_that_prometheus_raises(rendered):
    """The inhibitions hold back alerts by name: each name is one of dcu_prometheus' rules."""
    rules = yaml.safe_load((rendered / "dcu-serving.rules.yml").read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    text = " ".join(m for rule in INHIBIT_RULES for m in rule["source_matchers"] + rule["target_matchers"])
    used = set()
    for matcher in text.split():
        if matcher.startswith("alertname"):
            used |= set(matcher.split('"')[1].split("|"))
    assert used and used <= names, sorted(used - names)
