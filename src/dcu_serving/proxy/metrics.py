"""Prometheus metrics. Counters and histograms are updated per request; the backend and queue gauges are
read from the balancer at scrape time, so they cost the request path nothing."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60, 300)


class _BalancerCollector:
    def __init__(self, proxy):
        self._proxy = proxy

    def collect(self):
        balancer = self._proxy.balancer
        queue = GaugeMetricFamily("dcu_proxy_queue_depth", "Requests waiting in the proxy's queue for a slot")
        queue.add_metric([], balancer.queued if balancer else 0)
        yield queue
        families = {
            "active": GaugeMetricFamily("dcu_proxy_backend_active", "In-flight requests per backend",
                                        labels=["backend"]),
            "cap": GaugeMetricFamily("dcu_proxy_backend_cap", "Concurrent requests allowed per backend",
                                     labels=["backend"]),
            "healthy": GaugeMetricFamily("dcu_proxy_backend_healthy", "1 if the backend is in rotation",
                                         labels=["backend"]),
            "draining": GaugeMetricFamily("dcu_proxy_backend_draining", "1 if the backend is drained",
                                          labels=["backend"]),
        }
        failures = CounterMetricFamily("dcu_proxy_backend_failures", "Failed health checks and connections",
                                       labels=["backend"])
        for b in balancer.backends if balancer else ():
            families["active"].add_metric([b.name], b.active)
            families["cap"].add_metric([b.name], b.cap)
            families["healthy"].add_metric([b.name], 1 if b.healthy else 0)
            families["draining"].add_metric([b.name], 1 if b.draining else 0)
            failures.add_metric([b.name], b.failures)
        yield from families.values()
        yield failures


class Metrics:
    def __init__(self, proxy):
        self.registry = CollectorRegistry()
        self.requests = Counter("dcu_proxy_requests", "API requests answered, by HTTP status", ["status"],
                                registry=self.registry)
        self.latency = Histogram("dcu_proxy_request_duration_seconds",
                                 "End-to-end latency seen by the caller, queue time included",
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("dcu_proxy_time_to_first_token_seconds",
                              "Time to the first streamed chunk, queue time included",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram("dcu_proxy_queue_wait_seconds", "Time spent waiting for a slot",
                                    buckets=TTFT_BUCKETS, registry=self.registry)
        self.retries = Counter("dcu_proxy_retries", "Requests retried on another backend after a connect "
                               "failure", registry=self.registry)
        self.registry.register(_BalancerCollector(proxy))
        self._by_status: dict = {}

    def observe(self, status: int, latency: float, ttft: float | None, queue_wait: float | None):
        counter = self._by_status.get(status)
        if counter is None:
            counter = self._by_status[status] = self.requests.labels(str(status))
        counter.inc()
        self.latency.observe(latency)
        if ttft is not None:
            self.ttft.observe(ttft)
        if queue_wait is not None:
            self.queue_wait.observe(queue_wait)
