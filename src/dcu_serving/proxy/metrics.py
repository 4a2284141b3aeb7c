"""Prometheus metrics, exposed with prometheus-client.

Only the event loop touches them, so the per-request counters are plain integers and a bisect: the
library's own Counter and Histogram take a lock on every update (five per request), which cost about a
tenth of the proxy's CPU per request (bench/proxy_overhead.py). The collector turns them into metric
families at scrape time, as it does the backend and queue gauges read from the balancer.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .queueing import COST_CLASSES, cost_class

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180, 300, 600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60, 300)
# A document's parse takes seconds to many minutes (pages x the VLM's calls).
PARSE_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)


class Histogram:
    """Observations counted into buckets (upper bounds, inclusive) plus their sum."""

    __slots__ = ("bounds", "counts", "doc", "name", "sum")

    def __init__(self, name: str, doc: str, buckets: tuple):
        self.name = name
        self.doc = doc
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float):
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.doc, labels=[])
        self.add_to(family, [])
        return family

    def add_to(self, family: HistogramMetricFamily, labels: list[str]):
        buckets, cumulative = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric(labels, buckets, self.sum)


class Metrics:
    def __init__(self, proxy):
        self._proxy = proxy
        self.by_status: dict[tuple, int] = {}  # (api, model, status) -> requests
        self.backend_errors: dict[tuple, int] = {}  # (backend host:port, model) -> answers with status >= 500
        self.retries = 0
        self.latency = Histogram("dcu_proxy_request_duration_seconds",
                                 "End-to-end latency seen by the caller, queue time included", LATENCY_BUCKETS)
        self.ttft = Histogram("dcu_proxy_time_to_first_token_seconds",
                              "Time to the first streamed chunk, queue time included", TTFT_BUCKETS)
        self.queue_wait = Histogram("dcu_proxy_queue_wait_seconds", "Time spent waiting for a slot", TTFT_BUCKETS)
        # The requests that waited in a pool queued by cost, by their expected cost (queueing.COST_CLASSES).
        self.queue_wait_by_cost = {name: Histogram("", "", LATENCY_BUCKETS) for _, name in COST_CLASSES}
        # MinerU's parses through the entrance (mineru.py): apart from the model APIs' latency, as they take minutes.
        self.parse_duration = Histogram("dcu_proxy_mineru_parse_duration_seconds", "MinerU parses through the "
                                        "proxy, arrival to the answer's end (queue included)", PARSE_BUCKETS)
        self.parse_queue_wait = Histogram("dcu_proxy_mineru_queue_wait_seconds", "Time a MinerU parse waited for "
                                          "one of mineru.concurrency slots", PARSE_BUCKETS)
        self.parse_rejected: dict[str, int] = {}  # reason -> parses the proxy answered itself (mineru.REFUSALS)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def observe(self, api: str, model: str | None, status: int, latency: float, ttft: float | None,
                queue_wait: float | None, backend: str | None):
        if status != 200 and model is not None and model not in self._proxy.balancer.by_model:
            model = None  # a name no backend serves: not a label value (callers could make up any number)
        key = (api, model, status)
        by_status = self.by_status
        by_status[key] = by_status.get(key, 0) + 1
        if status >= 500 and backend is not None:  # an answer a card gave, or failed to give
            errors = self.backend_errors
            errors[backend, model] = errors.get((backend, model), 0) + 1
        self.latency.observe(latency)
        if ttft is not None:
            self.ttft.observe(ttft)
        if queue_wait is not None:
            self.queue_wait.observe(queue_wait)

    def parsed(self, status: int, latency: float, queue_wait: float | None, refused: str | None):
        """A MinerU parse ended: counted with the API requests (api `parse`), timed on its own."""
        key = ("parse", None, status)
        self.by_status[key] = self.by_status.get(key, 0) + 1
        self.parse_duration.observe(latency)
        if queue_wait is not None:
            self.parse_queue_wait.observe(queue_wait)
        if refused is not None:
            self.parse_rejected[refused] = self.parse_rejected.get(refused, 0) + 1

    def task_call(self, api: str, status: int, refused: str | None):
        """A call of MinerU's task API ended (api `parse_task`, `parse_status`, `parse_result`): counted with the API
        requests; the submissions and reads the proxy answered itself by their reason."""
        key = (api, None, status)
        self.by_status[key] = self.by_status.get(key, 0) + 1
        if refused is not None:
            self.parse_rejected[refused] = self.parse_rejected.get(refused, 0) + 1

    def errors_of(self, backend: str) -> int:
        """Answers with status >= 500 from one backend (host:port), every model."""
        return sum(count for (name, _), count in self.backend_errors.items() if name == backend)

    def queued(self, cost: float, wait: float):
        """A request that waited in a pool queued by cost got its slot after `wait` seconds."""
        self.queue_wait_by_cost[cost_class(cost)].observe(wait)

    def collect(self):
        requests = CounterMetricFamily("dcu_proxy_requests", "API requests answered, by API, model and HTTP status "
                                       "(model empty: none given, or one not served)",
                                       labels=["api", "model", "status"])
        for (api, model, status), count in sorted(self.by_status.items(), key=lambda item: (
                item[0][0], item[0][1] or "", item[0][2])):
            requests.add_metric([api, model or "", str(status)], count)
        yield requests
        yield self.latency.family()
        yield self.ttft.family()
        yield self.queue_wait.family()
        by_cost = HistogramMetricFamily("dcu_proxy_queue_wait_by_cost_seconds", "Time waiting for a slot in a pool "
                                        "queued by cost, by the request's expected seconds on a card",
                                        labels=["cost"])
        for name, histogram in self.queue_wait_by_cost.items():
            histogram.add_to(by_cost, [name])
        yield by_cost
        yield CounterMetricFamily("dcu_proxy_retries", "Requests retried on another backend after a connect "
                                  "failure", value=self.retries)
        errors = CounterMetricFamily("dcu_proxy_backend_errors", "Answers with status >= 500 from a backend, by "
                                     "backend and model: its own 5xx passed on, a connection that broke before the "
                                     "answer was whole (502), the deadline passed at the card (504)",
                                     labels=["backend", "model"])
        for (backend, model), count in sorted(self.backend_errors.items(), key=lambda i: (i[0][0], i[0][1] or "")):
            errors.add_metric([backend, model or ""], count)
        yield errors

        yield from self._mineru()
        relay = self._proxy.relay
        yield GaugeMetricFamily("dcu_proxy_body_bytes_held", "Bytes of request bodies the proxy holds now, "
                                "against body_budget (bodies that did not come with their request's head)",
                                value=relay.bodies if relay else 0)
        balancer = self._proxy.balancer
        queue = GaugeMetricFamily("dcu_proxy_queue_depth", "Requests waiting in the proxy's queue for a slot")
        queue.add_metric([], balancer.queued if balancer else 0)
        yield queue
        gauges = {
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
            gauges["active"].add_metric([b.name], b.active)
            gauges["cap"].add_metric([b.name], b.cap)
            gauges["healthy"].add_metric([b.name], 1 if b.healthy else 0)
            gauges["draining"].add_metric([b.name], 1 if b.draining else 0)
            failures.add_metric([b.name], b.failures)
        yield from gauges.values()
        yield failures
        pools = {
            "healthy": GaugeMetricFamily("dcu_proxy_model_backends_healthy", "Backends in rotation per served model",
                                         labels=["model", "kind"]),
            "total": GaugeMetricFamily("dcu_proxy_model_backends", "Backends per served model",
                                       labels=["model", "kind"]),
            "queue": GaugeMetricFamily("dcu_proxy_model_queue_depth", "Requests waiting for a slot, per served model "
                                       "(a pool serving several names counts its queue under each)",
                                       labels=["model", "kind"]),
            "by_cost": GaugeMetricFamily("dcu_proxy_model_queue_depth_by_cost", "Requests waiting for a slot, per "
                                         "served model and expected seconds on a card (FIFO pools: all in 0-1s)",
                                         labels=["model", "kind", "cost"]),
        }
        for g in balancer.groups if balancer else ():
            healthy = sum(1 for b in g.backends if b.healthy and not b.draining)
            by_cost = g.queued_by_cost()
            for model in g.models:
                pools["healthy"].add_metric([model, g.kind], healthy)
                pools["total"].add_metric([model, g.kind], len(g.backends))
                pools["queue"].add_metric([model, g.kind], g.queued)
                for name, count in by_cost.items():
                    pools["by_cost"].add_metric([model, g.kind, name], count)
        yield from pools.values()

    def _mineru(self):
        """MinerU's queue and limits at the entrance, and its own task counts from its /health; nothing while the
        entrance is off."""
        mineru = self._proxy.mineru
        status = mineru.status() if mineru is not None else None
        if status is None:
            return
        for name, doc, value in (
                ("parses_in_flight", "MinerU parses sent on and not yet answered", status["in_flight"]),
                ("parses_waiting", "MinerU parses waiting in the proxy's queue for a slot", status["waiting"]),
                ("concurrency", "MinerU parses allowed in flight (mineru.concurrency)", status["concurrency"]),
                ("queue_size", "MinerU parses allowed to wait (mineru.queue_size)", status["queue_size"]),
                ("max_upload_bytes", "The largest upload to MinerU (mineru.max_upload_mb)",
                 status["max_upload_bytes"]),
                ("task_submissions", "Task submissions (POST /mineru/tasks) let through and not yet answered by "
                 "MinerU", status["submitting"]),
                ("healthy", "1 if MinerU's /health answered healthy at the last check", int(status["healthy"]))):
            yield GaugeMetricFamily(f"dcu_proxy_mineru_{name}", doc, value=value)
        tasks = GaugeMetricFamily("dcu_proxy_mineru_tasks", "MinerU's own tasks by state, from its /health (its "
                                  "queue: parses from every caller, the entrance's and others')", labels=["state"])
        for state, count in status["tasks"].items():
            if isinstance(count, int):
                tasks.add_metric([state], count)
        yield tasks
        rejected = CounterMetricFamily("dcu_proxy_mineru_rejected", "MinerU parses, task submissions and task "
                                       "reads the proxy answered itself, by reason (queue_full, too_large, deadline, "
                                       "bad_task_id, not_owner, ...)", labels=["reason"])
        for reason, count in sorted(self.parse_rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield self.parse_duration.family()
        yield self.parse_queue_wait.family()
