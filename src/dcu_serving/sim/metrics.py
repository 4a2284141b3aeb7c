"""vLLM's Prometheus metrics (v1 engine names, labels model_name and engine) for one simulator."""

from __future__ import annotations

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

# vLLM's buckets, so dashboards built on a real server read the simulator the same way.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISHED_REASONS = ("stop", "length", "abort")

prometheus_client.disable_created_metrics()


class Metrics:
    def __init__(self, model_name: str, engine_index: str = "0"):
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        names = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": engine_index}

        def make(kind, name, doc, **kw):
            return kind(name, doc, names, registry=registry, **kw).labels(**values)

        self.running = make(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*names, "finished_reason"], registry=registry)
        self.success = {r: success.labels(finished_reason=r, **values) for r in FINISHED_REASONS}
        self.ttft = make(Histogram, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         buckets=TTFT_BUCKETS)
        self.itl = make(Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        buckets=ITL_BUCKETS)
        self.e2e = make(Histogram, "vllm:e2e_request_latency_seconds",
                        "Histogram of e2e request latency in seconds.", buckets=REQUEST_BUCKETS)
        self.queue_time = make(Histogram, "vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", buckets=REQUEST_BUCKETS)

    def watch(self, engine):
        """Gauges read the engine's state when scraped (nothing to keep in sync)."""
        self.running.set_function(lambda: engine.scheduler.running)
        self.waiting.set_function(lambda: len(engine.scheduler.waiting))
        self.kv_cache.set_function(lambda: engine.kv_cache_usage)

    def first_token(self, prompt_tokens: int, ttft: float):
        self.prefilled(prompt_tokens, ttft)
        self.generation_tokens.inc()

    def prefilled(self, prompt_tokens: int, ttft: float):
        """A prompt is processed (a pooling request ends here; a generated one has its first token)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.ttft.observe(ttft)

    def token(self, gap: float):
        self.generation_tokens.inc()
        self.itl.observe(gap)

    def finished(self, reason: str, e2e: float):
        self.success[reason].inc()
        self.e2e.observe(e2e)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
