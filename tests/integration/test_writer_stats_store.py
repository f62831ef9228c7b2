from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from streams.app.metrics import WorkerMetrics
from streams.app.writer import StoreWriter
from streams.grafana.boards_health import pipeline_health
from streams.grafana.macros import QueryContext, expand_query, panel_interval_ms
from streams.settings import Settings
from streams.store.requests_store import insert_requests
from tests.support.records import make_record

pytestmark = pytest.mark.clickhouse

REQUESTS = "ttft.requests"


class OwnsPartitionZero:
    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(REQUESTS, 0)}


def request(request_id: str, started_at: float) -> dict[str, Any]:
    return make_record(request_id, started_at=started_at)


def run_panel(client: Client, database: str, sql: str, ctx: QueryContext) -> list[tuple[Any, ...]]:
    """A panel's SQL as Grafana sends it, on ``database`` (panels name tables without one)."""
    before = client.database
    client.database = database
    try:
        return [tuple(r) for r in client.query(expand_query(sql, ctx)).result_rows]
    finally:
        client.database = before


def test_writer_stats_land_in_pipeline_stats_and_feed_the_health_panels(
    ch_client: Client, ch_database: str, ch_session_path: Path
) -> None:
    settings = Settings(clickhouse_url=SecretStr(f"chdb://{ch_session_path}"), clickhouse_database=ch_database)
    metrics = WorkerMetrics("writer", "w-int")
    writer = StoreWriter(settings, metrics)
    writer.client = ch_client
    writer.consumer = OwnsPartitionZero()  # type: ignore[assignment]
    assert writer.stats is not None
    now_ms = time.time() * 1000  # wall clock, like the writer: the table's TTL drops old samples

    async def scenario() -> bool:
        # A real insert through the writer's store thread gives the latency sample.
        await writer._insert("requests", insert_requests, ch_database, [request("r-1", now_ms - 5_000)])
        metrics.consumer_lag.labels(REQUESTS, "0").set(12)
        metrics.series_overflow.inc(3)
        # A join worker's heartbeat: its gauges, and the OTLP traces its bridge found cut apart.
        beat = {"worker_id": "j-int", "watermark_ms": 1.0, "source_partition": 0, "open_requests": 4, "evictions": 1}
        writer.join_stats.observe({**beat, "otlp_cut_off_traces": 2})
        assert writer.stats is not None
        return await writer.stats.write_once()

    try:
        assert asyncio.run(scenario())
    finally:
        writer.executor.shutdown(wait=True)

    rows = ch_client.query(
        f"SELECT metric, worker_id, role, labels, value FROM {ch_database}.pipeline_stats ORDER BY metric"
    ).result_rows
    assert [r[:4] for r in rows] == [
        ("consumer_lag", "w-int", "writer", {"topic": REQUESTS, "partition": "0"}),
        ("evictions", "j-int", "join", {}),
        ("insert_latency_ms", "w-int", "writer", {"table": "requests"}),
        ("open_requests", "j-int", "join", {}),
        ("otlp_cut_off_traces", "j-int", "join", {}),
        ("series_cap_hits", "w-int", "writer", {}),
    ]
    assert [rows[i][4] for i in (0, 1, 3, 4, 5)] == [12, 1, 4, 2, 3] and rows[2][4] > 0

    from_ms, to_ms = int(now_ms) - 3_600_000, int(now_ms) + 60_000
    stats_panels = [p for p in pipeline_health().panels if "pipeline_stats" in p.sql]
    assert {p.title for p in stats_panels} == {
        "Open requests and evictions",
        "OTLP traces cut apart",
        "Consumer lag",
        "Insert latency",
    }
    got: dict[str, list[tuple[Any, ...]]] = {}
    for panel in stats_panels:
        ctx = QueryContext(from_ms, to_ms, panel_interval_ms(from_ms, to_ms, 500, None))
        got[panel.title] = run_panel(ch_client, ch_database, panel.sql, ctx)
        assert run_panel(ch_client, ch_database, panel.expect_sql, ctx)[0][0] >= 1, panel.title
    assert [r[1:] for r in got["Consumer lag"]] == [("consumer_lag", 12.0)]
    assert sorted(r[1:] for r in got["Open requests and evictions"]) == [
        ("evictions", 1.0),
        ("open_requests", 4.0),
        ("series_cap_hits", 3.0),
    ]
    assert [r[1:] for r in got["OTLP traces cut apart"]] == [("otlp_cut_off_traces", 2.0)]
    [(_, table, latency_ms)] = got["Insert latency"]
    assert table == "requests" and latency_ms == rows[2][4]
