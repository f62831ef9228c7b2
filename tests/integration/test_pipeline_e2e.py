"""Issue 2 acceptance: real broker, `ttft worker` subprocesses, real chDB store, ground truth from the test."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from streams.ports import free_port
from tests.support.pipeline import Pipeline, WorkerProcess, group_lag, pipeline_drained, pipeline_env, produce_sync
from tests.support.traffic import Traffic, build_traffic, wrong_values

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

N_REQUESTS = 10_000


def _traffic() -> Traffic:
    return build_traffic(N_REQUESTS, start_ms=time.time() * 1000 - 60_000, spacing_ms=2.0)


def _start(pipe: Pipeline) -> tuple[WorkerProcess, WorkerProcess]:
    writer = pipe.start("writer", free_port())
    join = pipe.start("join", free_port())
    pipe.wait_healthy(writer)
    pipe.wait_healthy(join)
    return join, writer


def _check_store(pipe: Pipeline, traffic: Traffic) -> None:
    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_id: dict[str, dict[str, Any]] = {}
    for row in rows:
        assert row["request_id"] not in by_id, f"double-counted {row['request_id']}"
        by_id[row["request_id"]] = row
    assert set(by_id) == set(traffic.truth), (
        f"lost {len(set(traffic.truth) - set(by_id))}, unexpected {len(set(by_id) - set(traffic.truth))}"
    )
    wrong = wrong_values(by_id, traffic.truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"
    dls = pipe.query("SELECT source_partition, source_offset, reason_code FROM {db}.dead_letters FINAL")
    assert len(dls) == traffic.malformed
    assert len({(d["source_partition"], d["source_offset"]) for d in dls}) == traffic.malformed
    raw = pipe.query("SELECT count() AS n FROM {db}.dead_letters")
    assert raw[0]["n"] >= traffic.malformed


def test_pipeline_joins_10k_requests_exactly(kafka_settings: Any, tmp_path: Path) -> None:
    traffic = _traffic()
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    try:
        join, writer = _start(pipe)
        n = produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), traffic.messages)
        assert n == len(traffic.messages)
        pipe.wait_for(lambda: pipeline_drained(kafka_settings, join), 180, "the pipeline to drain")
        assert pipe.stop(join) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    _check_store(pipe, traffic)


def test_a_new_join_worker_resumes_from_the_committed_offsets(kafka_settings: Any, tmp_path: Path) -> None:
    """A join worker stopped mid-stream; a new one (an upgrade) takes over the same group and changelog,
    whose names are the ones every earlier join used: nothing re-read from the start, nothing skipped, open
    requests carried over."""
    traffic = _traffic()
    half = len(traffic.messages) // 2
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    b, topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    group = f"app-{kafka_settings.topic_prefix}-join"
    try:
        old = pipe.start("join", free_port())
        writer = pipe.start("writer", free_port())
        pipe.wait_healthy(old)
        pipe.wait_healthy(writer)
        produce_sync(b, topic, traffic.messages[:half])
        pipe.wait_for(lambda: group_lag(b, group, [topic]) == 0, 180, "the first join to commit the first half")
        assert pipe.stop(old) == 0
        new = pipe.start("join", free_port())
        pipe.wait_healthy(new)
        produce_sync(b, topic, traffic.messages[half:])
        pipe.wait_for(lambda: pipeline_drained(kafka_settings, new), 180, "the new join to drain")
        consumed = new.metric("ttft_events_consumed_total")
        assert pipe.stop(new) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    # The new join read only what the first had not committed (the second half, give or take the
    # last uncommitted batch), and the store holds every request exactly.
    assert consumed <= len(traffic.messages) - half + 10_000, consumed
    assert consumed >= len(traffic.messages) - half, consumed
    _check_store(pipe, traffic)
