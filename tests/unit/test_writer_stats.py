from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from streams.app.metrics import WorkerMetrics
from streams.app.stats import JoinStats, StatsReporter
from streams.app.writer import StoreWriter
from streams.grafana import boards_health
from streams.settings import Settings
from streams.store import stats_store
from streams.store.stats_store import insert_stats
from tests.support.records import make_record

REQUESTS = "ttft.requests"
NOW_S = 1_800_000_000.0


class FakeStore:
    """A ``store_call``: records each call, or raises ``error`` while it is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self.error: Exception | None = None

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.error is not None:
            raise self.error
        self.calls.append((fn, args))
        return None


def reporter(metrics: WorkerMetrics, store: FakeStore, **kwargs: Any) -> StatsReporter:
    return StatsReporter(
        metrics, store, "db1", owned=lambda: {(REQUESTS, 0), (REQUESTS, 1)}, clock=lambda: NOW_S, **kwargs
    )


def by_metric(samples: list[dict[str, Any]]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s["metric"], tuple(sorted(s["labels"].items()))): s["value"] for s in samples}


def written(store: FakeStore, i: int = -1) -> list[dict[str, Any]]:
    fn, (database, samples) = store.calls[i]
    assert (fn, database) == (insert_stats, "db1")
    return list(samples)


def test_metric_names_are_the_ones_the_health_dashboard_reads() -> None:
    assert stats_store.STATS_METRICS == boards_health.STATS_METRICS


def test_a_round_samples_lag_of_owned_partitions_mean_insert_latency_and_series_cap_hits() -> None:
    metrics, store = WorkerMetrics("writer", "w-1"), FakeStore()
    metrics.consumer_lag.labels(REQUESTS, "0").set(5)
    metrics.consumer_lag.labels(REQUESTS, "7").set(99)  # revoked since: another writer reports it
    metrics.insert_seconds.labels("requests").observe(0.010)
    metrics.insert_seconds.labels("requests").observe(0.030)
    metrics.insert_seconds.labels("dead_letters").observe(0.002)
    metrics.series_overflow.inc(4)
    stats = reporter(metrics, store)
    assert asyncio.run(stats.write_once())
    samples = written(store)
    assert {s["metric"] for s in samples} <= set(boards_health.STATS_METRICS)
    assert all((s["ts"], s["worker_id"], s["role"]) == (NOW_S * 1000, "w-1", "writer") for s in samples)
    assert by_metric(samples) == pytest.approx(
        {
            ("consumer_lag", (("partition", "0"), ("topic", REQUESTS))): 5.0,
            ("insert_latency_ms", (("table", "dead_letters"),)): 2.0,
            ("insert_latency_ms", (("table", "requests"),)): 20.0,
            ("series_cap_hits", ()): 4.0,
        }
    )

    # Next round: latency is the mean of the inserts since the last written round; none, no sample.
    metrics.insert_seconds.labels("requests").observe(0.050)
    assert asyncio.run(stats.write_once())
    assert by_metric(written(store)) == pytest.approx(
        {
            ("consumer_lag", (("partition", "0"), ("topic", REQUESTS))): 5.0,
            ("insert_latency_ms", (("table", "requests"),)): 50.0,
            ("series_cap_hits", ()): 4.0,
        }
    )


def test_a_failed_round_only_logs_a_warning_and_its_latency_goes_into_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics, store = WorkerMetrics("writer", "w-1"), FakeStore()
    stats = reporter(metrics, store)
    metrics.insert_seconds.labels("requests").observe(0.040)
    store.error = ConnectionError("store down")
    with caplog.at_level(logging.WARNING, logger="ttft.writer"):
        assert not asyncio.run(stats.write_once())
    assert "pipeline_stats not written" in caplog.text and store.calls == []
    store.error = None
    assert asyncio.run(stats.write_once())
    assert by_metric(written(store))[("insert_latency_ms", (("table", "requests"),))] == pytest.approx(40.0)


def test_even_a_bug_in_building_a_round_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> set[tuple[str, int]]:
        raise KeyError("assignment")

    metrics, store = WorkerMetrics("writer", "w-1"), FakeStore()
    stats = StatsReporter(metrics, store, "db1", owned=broken)
    with caplog.at_level(logging.WARNING, logger="ttft.writer"):
        assert not asyncio.run(stats.write_once())
    assert "KeyError" in caplog.text


def test_no_round_is_tried_while_the_record_path_is_retrying_the_store() -> None:
    metrics, store = WorkerMetrics("writer", "w-1"), FakeStore()
    down = [True]
    stats = reporter(metrics, store, store_down=lambda: down[0])
    assert not asyncio.run(stats.write_once()) and store.calls == []
    down[0] = False
    assert asyncio.run(stats.write_once()) and len(store.calls) == 1


def test_the_loop_writes_every_interval_until_stopped_and_survives_failures() -> None:
    metrics, store = WorkerMetrics("writer", "w-1"), FakeStore()
    stats = reporter(metrics, store, interval_s=0.01)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(stats.run(stop))
        store.error = RuntimeError("boom")
        await asyncio.sleep(0.05)
        store.error = None
        while len(store.calls) < 2:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=1)

    asyncio.run(scenario())
    assert len(store.calls) >= 2


# --- the writer: stats go through its store thread, and their failures never touch the record path ---------


class FakeClient:
    """clickhouse-connect's ``insert`` only: ``pipeline_stats`` always fails, other tables are kept."""

    def __init__(self) -> None:
        self.inserted: dict[str, int] = {}
        self.stats_attempts = 0

    def insert(self, table: str, data: list[list[Any]], column_oriented: bool = False, **_: Any) -> None:
        if table == "pipeline_stats":
            self.stats_attempts += 1
            raise OSError("pipeline_stats is on fire")
        rows = len(data[0]) if column_oriented else len(data)
        self.inserted[table] = self.inserted.get(table, 0) + rows


class FakeConsumer:
    """Serves ``batches`` in order, then empty polls (sleeping ``idle_s`` of real time each)."""

    def __init__(self, batches: list[dict[TopicPartition, list[Any]]], idle_s: float = 0.0) -> None:
        self.batches = batches
        self.idle_s = idle_s
        self.commits: list[dict[TopicPartition, int]] = []
        self.polls = 0
        self.after_poll: Callable[[], None] = lambda: None

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        self.polls += 1
        self.after_poll()
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep(self.idle_s)
        return {}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def highwater(self, tp: TopicPartition) -> int:
        return 10

    def last_poll_timestamp(self, tp: TopicPartition) -> int | None:
        return None

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return None  # no transactions: the runner reads the high watermark

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(REQUESTS, 0)}

    async def stop(self) -> None:
        return None


def request(request_id: str, started_at: float) -> dict[str, Any]:
    return make_record(request_id, started_at=started_at)


def message(offset: int, value: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(offset=offset, key=value["request_id"].encode(), value=orjson.dumps(value))


def test_failing_stats_writes_never_stop_or_hold_up_the_records(caplog: pytest.LogCaptureFixture) -> None:
    metrics = WorkerMetrics("writer", "w-1")
    writer = StoreWriter(Settings(), metrics, stats_interval_s=0.01)
    client = writer.client = FakeClient()
    tp = TopicPartition(REQUESTS, 0)
    consumer = FakeConsumer([{tp: [message(0, request("r-1", NOW_S * 1000))]}], idle_s=0.01)
    writer.consumer = consumer  # type: ignore[assignment]

    def stop_after_two_failed_rounds() -> None:
        if client.stats_attempts >= 2:
            writer.runner.stop()

    consumer.after_poll = stop_after_two_failed_rounds
    with caplog.at_level(logging.WARNING, logger="ttft.writer"):
        asyncio.run(asyncio.wait_for(writer.run(), timeout=10))
    assert client.inserted == {"requests": 1} and consumer.commits == [{tp: 1}]
    assert client.stats_attempts >= 2 and "pipeline_stats not written (OSError" in caplog.text
    # A stats failure is not a store failure of the record path: nothing retried, nothing counted.
    assert metrics.registry.get_sample_value("ttft_insert_failures_total") == 0
    assert not writer.store_failing
    assert metrics.registry.get_sample_value("ttft_records_written_total") == 1


def test_join_gauges_from_heartbeats_and_forgetting_a_silent_worker() -> None:
    now = [1000.0]
    stats = JoinStats("ttft.stage-events", forget_after_s=30.0, clock=lambda: now[0])
    stats.observe({"watermark_ms": 1.0, "source_partition": 2})  # an older join: no gauges, ignored
    assert stats.samples(5.0) == []
    beat = {"watermark_ms": 1.0, "source_partition": 2, "worker_id": "join-1", "open_requests": 40, "evictions": 3}
    stats.observe({**beat, "lag": 7})
    stats.observe({**beat, "source_partition": 5, "lag": None, "open_requests": 41, "otlp_cut_off_traces": 2})
    rows = {
        (r["worker_id"], r["role"], r["metric"], tuple(sorted(r["labels"].items()))): r["value"]
        for r in stats.samples(5.0)
    }
    assert rows == {
        ("join-1", "join", "open_requests", ()): 41.0,
        ("join-1", "join", "evictions", ()): 3.0,
        ("join-1", "join", "otlp_cut_off_traces", ()): 2.0,  # 0 from a join without the OTLP bridge
        ("join-1", "join", "consumer_lag", (("partition", "2"), ("topic", "ttft.stage-events"))): 7.0,
    }
    now[0] += 31
    assert stats.samples(6.0) == []
