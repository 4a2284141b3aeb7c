# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What connects to what: a host's dcu-proxy backends from its vLLM instances, and across the fleet the
addresses each host's pieces are reached at (Prometheus' targets, the gateway's hosts) from the facts each
role exports. Every list here is built from exported facts, never from another role's defaults."""


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
