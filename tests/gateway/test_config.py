"""The gateway's LiteLLM config from the inventory's hosts: every model on every host, the choices that keep
requests safe (retries only where no work was done), and mistakes named with their variable."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.dcu.serving.plugins.filter.gateway import gateway_config

HOSTS = [{"name": "dcu-a", "url": "http://10.0.0.11:8000", "models": ["MiniCPM-V-4.5", "bge-m3"]},
         {"name": "dcu-b", "url": "http://10.0.0.12:8000/", "models": ["MiniCPM-V-4.5"]}]


def test_every_model_on_every_host_is_a_deployment_on_its_proxy():
    config = gateway_config(HOSTS)
    got = [(d["model_name"], d["litellm_params"]["api_base"], d["model_info"]["id"]) for d in config["model_list"]]
    assert got == [("MiniCPM-V-4.5", "http://10.0.0.11:8000/v1", "dcu-a/MiniCPM-V-4.5"),
                   ("bge-m3", "http://10.0.0.11:8000/v1", "dcu-a/bge-m3"),
                   ("MiniCPM-V-4.5", "http://10.0.0.12:8000/v1", "dcu-b/MiniCPM-V-4.5")]
    router = config["router_settings"]
    assert router["routing_strategy"] == "least-busy"
    # Once to another host where nothing was generated; never after a timeout or a broken answer.
    policy = router["retry_policy"]
    assert policy["ServiceUnavailableErrorRetries"] == 1 and policy["DefaultRetries"] == 1
    assert policy["TimeoutErrorRetries"] == 0 and policy["InternalServerErrorRetries"] == 0
    # A host is left out past allowed_fails failures, whatever it answered before (a refused connection is a 500).
    assert router["allowed_fails_policy"] == {"InternalServerErrorAllowedFails": 3, "BadGatewayErrorAllowedFails": 3,
                                              "ServiceUnavailableErrorAllowedFails": 3, "TimeoutErrorAllowedFails": 3}
    # The gateway proves itself to each dcu-proxy with the vault's secret, read from its environment: never a key in
    # the file, and the health checks (the deployment's own api_key) carry it too.
    assert {d["litellm_params"]["api_key"] for d in config["model_list"]} == {"os.environ/DCU_GATEWAY_PROXY_SECRET"}
    general = config["general_settings"]
    assert general["custom_auth"] == "dcu_serving.gateway.auth.user_api_key_auth"
    assert general["master_key"] == "os.environ/LITELLM_MASTER_KEY"  # never the key itself in the file
    assert config["litellm_settings"]["turn_off_message_logging"] is True


def test_each_deployment_says_its_kind_so_litellm_probes_it_in_its_own_api():
    hosts = [{"name": "dcu-a", "url": "http://10.0.0.11:8000",
              "models": ["Qwen3-32B", "MiniCPM-V-4.5", "bge-m3", "bge-reranker-v2-m3", "whisper-large-v3",
                         "CosyVoice3-0.5B", "unlisted"],
              "kinds": {"Qwen3-32B": "chat", "MiniCPM-V-4.5": "vision", "bge-m3": "embedding",
                        "bge-reranker-v2-m3": "rerank", "whisper-large-v3": "transcription",
                        "CosyVoice3-0.5B": "speech"}}]
    modes = {d["model_name"]: d["model_info"].get("mode") for d in gateway_config(hosts)["model_list"]}
    assert modes == {"Qwen3-32B": None, "MiniCPM-V-4.5": None, "bge-m3": "embedding", "bge-reranker-v2-m3": "rerank",
                     "whisper-large-v3": "audio_transcription", "CosyVoice3-0.5B": "audio_speech", "unlisted": None}


def test_hosts_over_tls_are_verified_with_their_ca_and_never_without_one():
    assert "ssl_verify" not in gateway_config(HOSTS, {"hosts_ca": "/etc/dcu-gateway/hosts-ca.pem"})["litellm_settings"]
    tls = [dict(HOSTS[0], url="https://10.0.0.11:8443"), HOSTS[1]]
    config = gateway_config(tls, {"hosts_ca": "/etc/dcu-gateway/hosts-ca.pem"})
    assert config["litellm_settings"]["ssl_verify"] == "/etc/dcu-gateway/hosts-ca.pem"
    assert config["model_list"][0]["litellm_params"]["api_base"] == "https://10.0.0.11:8443/v1"
    with pytest.raises(AnsibleFilterError, match="the serving hosts dcu-a answer over TLS, but the gateway has no CA"):
        gateway_config(tls)


def test_settings_reach_the_config():
    config = gateway_config(HOSTS, {"request_timeout": 1800, "retries": 0, "cooldown": 5, "allowed_fails": 1})
    assert set(config["router_settings"]["allowed_fails_policy"].values()) == {1}
    assert config["litellm_settings"]["request_timeout"] == 1800
    assert config["router_settings"]["retry_policy"]["DefaultRetries"] == 0
    assert config["router_settings"]["cooldown_time"] == 5


@pytest.mark.parametrize(("hosts", "settings", "message"), [
    ([], None, "dcu_gateway_hosts: no serving host"),
    ([{"name": "a", "url": "http://10.0.0.11:8000/v1", "models": ["m"]}], None, "dcu_gateway_hosts[0].url"),
    ([{"name": "a", "url": "http://10.0.0.11:8000", "models": []}], None, "dcu_gateway_hosts[0].models"),
    ([{"url": "http://10.0.0.11:8000", "models": ["m"]}], None, "dcu_gateway_hosts[0]: needs name and url"),
    (HOSTS, {"retries": -1}, "dcu_gateway_retries"),
])
def test_mistakes_name_the_variable(hosts, settings, message):
    with pytest.raises(AnsibleFilterError) as err:
        gateway_config(hosts, settings)
    assert message in str(err.value)


def test_the_role_installs_exactly_the_pinned_requirements():
    """roles/dcu_gateway/files/requirements.txt is the collection's copy of requirements/gateway.txt (requirements/
    is not part of the collection): a re-pin that forgets the copy would install other versions than reviewed."""
    from support import REPO
    pinned = (REPO / "requirements/gateway.txt").read_text()
    assert (REPO / "roles/dcu_gateway/files/requirements.txt").read_text() == pinned
    assert "litellm==1.106.12" in pinned and pinned.count("--hash=sha256:") > 117


MINERU_HOSTS = [dict(HOSTS[0], url="https://10.0.0.11:8443", mineru={"max_upload_mb": 50, "timeout": 1800}),
                dict(HOSTS[1], url="https://10.0.0.12:8443")]
GATEWAY = {"hosts_ca": "/etc/dcu-gateway/hosts-ca.pem", "public_url": "https://10.0.0.5:4000/"}


def test_minerus_api_is_off_unless_the_inventory_turns_it_on():
    config = gateway_config(MINERU_HOSTS, GATEWAY)
    assert "pass_through_endpoints" not in config["general_settings"] and "environment_variables" not in config


def test_minerus_api_is_a_pass_through_per_host_that_serves_it_with_the_callers_key_and_the_gateways_secret():
    config = gateway_config(MINERU_HOSTS, dict(GATEWAY, mineru=True))
    (endpoint,) = config["general_settings"]["pass_through_endpoints"]  # dcu-b's MinerU is on its own port only
    assert endpoint == {
        "path": "/mineru/dcu-a", "target": "https://10.0.0.11:8443/mineru", "include_subpath": True, "auth": True,
        "methods": ["GET", "POST"], "timeout": 1830,  # the host's deadline and a margin: the caller gets its 504
        "headers": {"Authorization": "Bearer os.environ/DCU_GATEWAY_PROXY_SECRET",  # never the secret in the file
                    "X-MinerU-Entrance": "https://10.0.0.5:4000/mineru/dcu-a"}}
    assert config["environment_variables"] == {"DCU_GATEWAY_MINERU_UPLOADS": '{"/mineru/dcu-a": 52428800}'}
    assert config["litellm_settings"]["ssl_verify"] == "/etc/dcu-gateway/hosts-ca.pem"  # pass-throughs use it too


@pytest.mark.parametrize(("hosts", "settings", "message"), [
    (HOSTS, dict(GATEWAY, mineru=True), "no serving host has MinerU's API through its dcu-proxy"),
    (MINERU_HOSTS, dict(GATEWAY, mineru=True, public_url="gateway:4000"), "dcu_gateway_public_url"),
    ([dict(MINERU_HOSTS[0], mineru={"max_upload_mb": 0})], dict(GATEWAY, mineru=True),
     "dcu_gateway_hosts[0].mineru.max_upload_mb"),
    ([dict(MINERU_HOSTS[0], name="a b")], dict(GATEWAY, mineru=True), "cannot be a path of the gateway"),
])
def test_minerus_mistakes_name_the_variable(hosts, settings, message):
    with pytest.raises(AnsibleFilterError) as err:
        gateway_config(hosts, settings)
    assert message in str(err.value)
