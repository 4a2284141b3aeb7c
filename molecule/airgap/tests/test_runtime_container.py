"""Runtime container on a node without network: the image came from the bundle, one container per card."""

from __future__ import annotations

testinfra_hosts = ["air"]


def test_the_image_was_loaded_from_the_bundle_and_runs_once_per_card(host):
    loaded = host.check_output("docker image ls --format '{{.Repository}}:{{.Tag}}'").split()
    assert "dcu-serving/vllm-sim:0.11.0" in loaded
    assert host.file("/var/lib/dcu-serving/bundle/images/dcu-serving_vllm-sim_0.11.0.tar.gz").exists
    running = host.check_output("docker ps --format '{{.Names}}'").split()
    assert sorted(name for name in running if name.startswith("vllm-")) == ["vllm-0", "vllm-1"]
    assert set(running) == {"vllm-0", "vllm-1", "dcu-proxy", "dcu-exporter"}  # and the proxy's
    # (dcu_proxy_runtime: container), and the card exporter from the proxy's image
