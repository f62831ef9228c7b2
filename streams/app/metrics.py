"""Worker metrics: a closed set of names, served as Prometheus text on ``/metrics`` with ``/healthz``.

Every worker process owns one :class:`WorkerMetrics` (its own registry, so tests can run several in one
interpreter). The HTTP endpoint runs on the worker's event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class WorkerMetrics:
    """The metrics one worker exposes. Names are fixed here; labels are bounded."""

    def __init__(self, role: str, worker_id: str) -> None:
        self.role = role
        self.worker_id = worker_id
        r = self.registry = CollectorRegistry()
        self.events_consumed = Counter("ttft_events_consumed", "Stage events consumed", registry=r)
        self.events_acked = Counter("ttft_events_acked", "Stage events acknowledged", registry=r)
        self.unacked_events = Gauge("ttft_unacked_events", "Events taken but not yet acknowledged", registry=r)
        self.open_requests = Gauge("ttft_open_requests", "Requests waiting for their stages", registry=r)
        self.pool_open_requests = Gauge(
            "ttft_pool_open_requests", "Open requests of unregistered tenants (the shared pool)", registry=r
        )
        self.pool_remembered_requests = Gauge(
            "ttft_pool_remembered_requests",
            "Emitted requests of unregistered tenants kept to absorb late events (the shared pool)",
            registry=r,
        )
        self.promoted_tenants = Gauge(
            "ttft_promoted_tenants", "Tenants the join promoted out of the pool by steady traffic", registry=r
        )
        self.evictions = Counter("ttft_evictions", "Open requests evicted by max_open_requests", registry=r)
        self.duplicates = Counter("ttft_duplicate_events", "Duplicate events counted once", registry=r)
        self.late_events = Counter("ttft_late_events", "Events for already emitted requests", registry=r)
        self.replayed_events = Counter(
            "ttft_replayed_events_skipped", "Re-delivered events already folded (skipped)", registry=r
        )
        self.repaired_events = Counter(
            "ttft_gap_events_repaired", "Events the consumer skipped, read back and folded", registry=r
        )
        self.join_core = Gauge(
            "ttft_join_core_info",
            "1 for the build of the join's core this worker runs: native (mypyc) or python",
            ["build"],
            registry=r,
        )
        self.records_emitted = Counter("ttft_records_emitted", "Request records produced", ["status"], registry=r)
        self.dead_letters = Counter("ttft_dead_letters", "Messages dead-lettered", ["reason"], registry=r)
        self.consumer_lag = Gauge(
            "ttft_consumer_lag", "Messages behind the log end", ["topic", "partition"], registry=r
        )
        self.records_written = Counter("ttft_records_written", "Request rows inserted", registry=r)
        self.dead_letters_written = Counter("ttft_dead_letters_written", "Dead-letter rows inserted", registry=r)
        self.unacked_records = Gauge(
            "ttft_unacked_records", "Records consumed by the writer, not yet committed", registry=r
        )
        self.insert_seconds = Histogram(
            "ttft_insert_seconds",
            "ClickHouse insert latency",
            ["table"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.insert_failures = Counter("ttft_insert_failures", "Failed inserts (retried)", registry=r)
        self.rows_refused = Counter(
            "ttft_rows_refused", "Rows the store refused deterministically (dead-lettered)", ["table"], registry=r
        )
        self.windows_closed = Counter("ttft_windows_closed", "Windows aggregated", registry=r)
        self.open_windows = Gauge("ttft_open_windows", "Windows with records, not yet closed", registry=r)
        self.watermark = Gauge("ttft_writer_watermark_ms", "Event-time watermark of the writer", registry=r)
        self.window_amendments = Counter("ttft_window_amendments", "Closed windows re-aggregated", registry=r)
        self.window_close_seconds = Histogram(
            "ttft_window_close_seconds",
            "Closing one window: records (from the writer's copy or the store), aggregates, rules",
            ["source"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.window_jobs_queued = Gauge(
            "ttft_window_jobs_queued", "Window closes and rule calls waiting for the background task", registry=r
        )
        self.window_held_records = Gauge(
            "ttft_window_held_records", "Records of open windows the writer holds for their close", registry=r
        )
        self.caps_tripped = Counter(
            "ttft_caps_tripped", "Times a bound tripped (docs/operations.md, hostile input)", ["cap"], registry=r
        )
        self.series_overflow = Counter("ttft_series_overflow", "Records mapped to __other__", registry=r)
        self.quarantined_sources = Gauge(
            "ttft_quarantined_sources",
            "Sources (tenant, producer, partition) the dead-letter guard holds in quarantine",
            ["kind"],
            registry=r,
        )
        self.alerts_refused = Counter(
            "ttft_alerts_refused",
            "Alerts Alertmanager refused for what they hold (400): dropped, never re-sent",
            ["alertname"],
            registry=r,
        )
        self.alerts_sent = Counter("ttft_alert_transitions", "Alert transitions produced", ["state"], registry=r)
        self.alerts_pending_delivery = Gauge(
            "ttft_alerts_pending_delivery", "Alert notifications not yet delivered", registry=r
        )
        self.alert_delivery_restarts = Counter(
            "ttft_alert_delivery_restarts",
            "Alertmanager delivery loop restarted after it died",
            ["reason"],
            registry=r,
        )
        self.paging_muted = Counter("ttft_paging_muted", "Notifications muted during replay", registry=r)
        self.rule_evaluations = Counter(
            "ttft_rule_evaluations", "Rule evaluations by rule and outcome", ["rule", "outcome"], registry=r
        )
        self.batches = Counter("ttft_batches", "Processing batches", registry=r)
        self.produce_refused = Counter(
            "ttft_produce_refused",
            "Producer batches (what=batch) or aggregate rows (what=row) the broker refused with a retriable error, "
            "sent again every second until taken; grows while the broker is away longer than the request timeout",
            ["what"],
            registry=r,
        )
        self.otlp_messages = Counter("ttft_otlp_messages", "OTLP span messages consumed and committed", registry=r)
        self.otlp_spans = Counter(
            "ttft_otlp_spans",
            "OTLP spans by outcome: stage (forwarded), not_stage, dead_letter, replayed (already forwarded)",
            ["outcome"],
            registry=r,
        )
        self.otlp_no_first_chunk = Counter(
            "ttft_otlp_no_first_chunk",
            "LLM spans without a first chunk (forwarded as llm_unmeasured: their requests are no_first_chunk), by the "
            "instrumentation scope that made them (name, version)",
            ["scope", "scope_version"],
            registry=r,
        )
        self.otlp_cut_off_traces = Counter(
            "ttft_otlp_cut_off_traces",
            "OTLP traces that start at a stage span: one stage span alone, or a retrieval root without an LLM span. "
            "A request's part that lost its OpenTelemetry context is one, stored as a request of its own; so is a "
            "batch job's single call (ttft otel check names them, with the fix)",
            registry=r,
        )
        self.otlp_tenant_claims_ignored = Counter(
            "ttft_otlp_tenant_claims_ignored",
            "OTLP spans naming a tenant other than their resource's tenant.id, the claim dropped "
            "(otlp.tenant_source: resource; docs/otlp-mapping.md, Authenticated tenants)",
            registry=r,
        )
        self.otlp_unkeyed_messages = Counter(
            "ttft_otlp_unkeyed_messages",
            "OTLP span messages that are not one trace keyed by its id (a Collector without partition_traces_by_id)",
            registry=r,
        )
        self.otlp_spans_held = Gauge("ttft_otlp_spans_held", "OTLP spans held until their trace resolves", registry=r)
        self.otlp_traces_held = Gauge("ttft_otlp_traces_held", "OTLP traces held, not yet resolved", registry=r)
        self.health: dict[str, Any] = {"status": "starting", "role": role, "worker_id": worker_id}

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def serve_metrics(
    metrics: WorkerMetrics,
    port: int,
    health: Callable[[], dict[str, Any]] | None = None,
    host: str = "127.0.0.1",
) -> tuple[web.AppRunner, int]:
    """Start ``/metrics`` and ``/healthz`` on host:port (0 = free port); returns the runner and port."""

    async def _metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(_: web.Request) -> web.Response:
        body = dict(metrics.health)
        if health is not None:
            body.update(health())
        status = 200 if body.get("status") in ("ok", "starting") else 503
        return web.Response(text=json.dumps(body), status=status, content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server: Any = site._server
    bound = port
    if server is not None and getattr(server, "sockets", None):
        bound = int(server.sockets[0].getsockname()[1])
    return runner, bound


def sync_counter(counter: Any, total: int) -> None:
    """Move a Prometheus counter up to a running total kept by the core."""
    current = counter._value.get()
    if total > current:
        counter.inc(total - current)
