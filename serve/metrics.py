"""Prometheus metrics of the gateway (one registry per app, so tests can build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)


class Metrics:
    """The gateway's counters, gauges and histograms."""

    def __init__(self) -> None:
        """Fresh metrics in their own registry."""
        r = self.registry = CollectorRegistry()
        self.latency = Histogram(
            "hivig_request_seconds",
            "Request latency by route",
            ["route"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.model_latency = Histogram(
            "hivig_model_seconds",
            "Backend call latency by call",
            ["call"],
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.queue_depth = Gauge(
            "hivig_queue_depth", "Model calls in flight or waiting", registry=r
        )
        self.sessions_open = Gauge("hivig_sessions_open", "Open sessions", registry=r)
        self.verdicts = Counter(
            "hivig_verdicts_total",
            "Verdicts by value and platform",
            ["verdict", "platform"],
            registry=r,
        )
        self.dimensions = Counter(
            "hivig_error_dimensions_total",
            "Bad verdicts by error dimension and platform",
            ["dimension", "platform"],
            registry=r,
        )
        self.degraded = Counter(
            "hivig_degraded_total",
            "Degraded answers by call and reason",
            ["call", "reason"],
            registry=r,
        )
        self.parse = Counter(
            "hivig_parse_total",
            "Model outputs by call and parse status",
            ["call", "status"],
            registry=r,
        )
        self.tokens = Counter(
            "hivig_tokens_total", "Tokens by kind (prompt, completion)", ["kind"], registry=r
        )
        self.recurrence = Counter(
            "hivig_recurrence_total", "Recurrence detector fires by type", ["type"], registry=r
        )
        self.errors = Counter("hivig_errors_total", "Error responses by code", ["code"], registry=r)
        self.rejected_coords = Counter(
            "hivig_coordinate_rejections_total",
            "Out-of-frame actions by coord_space",
            ["space"],
            registry=r,
        )
        self.trace_errors = Counter(
            "hivig_trace_errors_total",
            "Trace events not written when answered, by outcome (deferred: written later; "
            "dropped: lost to a full backlog)",
            ["outcome"],
            registry=r,
        )
        self.trace_pending = Gauge(
            "hivig_trace_pending", "Trace events waiting in memory to be written", registry=r
        )
