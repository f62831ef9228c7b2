"""Issue 8: a bad upstream deploy halts ingestion before commit, with a distinct exit code and a page."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from streams.kafka.batches import EXIT_INGEST_HALTED
from tests.support.pipeline import Pipeline, group_lag, pipeline_env, produce_sync, read_topic
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dead_letter_flood_halts_ingestion_before_commit(kafka_settings: Any, tmp_path: Path) -> None:
    good = build_traffic(300, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    flood = [(b"bad", b"{not json at all") for _ in range(1_500)]
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_CAPS__HALT_WINDOW_MESSAGES="500",
        TTFT_CAPS__HALT_DEAD_LETTER_SHARE="0.5",
    )
    pipe = Pipeline(env, tmp_path)
    topic = kafka_settings.topic("stage-events")
    try:
        join = pipe.start("join", _free_port())
        pipe.wait_healthy(join)
        produce_sync(kafka_settings.kafka_bootstrap, topic, good.messages)
        produce_sync(kafka_settings.kafka_bootstrap, topic, flood)
        join.proc.wait(timeout=120)
        assert join.proc.returncode == EXIT_INGEST_HALTED, join.log()[-3000:]
        assert "TTFTIngestHalted" in join.log()
        assert "docs/operations.md" in join.log()
    finally:
        pipe.stop_all()
    group = f"app-{kafka_settings.topic_prefix}-join"
    lag = group_lag(kafka_settings.kafka_bootstrap, group, [topic])
    # The halting batch and everything after it stay uncommitted: far more than the window is left.
    assert lag >= 1_000, lag
    raw = asyncio.run(read_topic(kafka_settings.kafka_bootstrap, kafka_settings.topic("alerts")))
    alerts = [orjson.loads(value) for _, value in raw]
    halted = [a for a in alerts if a["alertname"] == "TTFTIngestHalted"]
    assert halted and halted[0]["state"] == "firing"
    assert halted[0]["labels"]["severity"] == "page"


def test_one_tenants_bad_deploy_is_quarantined_and_everyone_else_keeps_flowing(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """Issue 14 item 7: the same flood, but from one tenant: quarantine it, never halt the others."""
    good = build_traffic(300, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    bad_event = {"request_id": "x", "tenant_id": "bad-deploy", "stage": "retrieval", "ts_ms": time.time() * 1000}
    flood = [
        (f"x{i}".encode(), orjson.dumps({**bad_event, "request_id": f"x{i}", "duration_ms": -1.0}))
        for i in range(1_500)
    ]
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_CAPS__HALT_WINDOW_MESSAGES="500",
        TTFT_CAPS__HALT_DEAD_LETTER_SHARE="0.5",
    )
    pipe = Pipeline(env, tmp_path)
    topic = kafka_settings.topic("stage-events")
    try:
        join = pipe.start("join", _free_port())
        pipe.wait_healthy(join)
        produce_sync(kafka_settings.kafka_bootstrap, topic, flood)
        produce_sync(kafka_settings.kafka_bootstrap, topic, good.messages)
        group = f"app-{kafka_settings.topic_prefix}-join"
        pipe.wait_for(lambda: group_lag(kafka_settings.kafka_bootstrap, group, [topic]) == 0, 120, "the join to drain")
        assert join.alive(), join.log()[-3000:]
        metrics = join.metrics()
        assert metrics['ttft_caps_tripped_total{cap="tenant_quarantine"}'] == 1
        assert metrics['ttft_dead_letters_total{reason="schema"}'] == 1_500
        assert "tenant 'bad-deploy' quarantined" in join.log()
        assert pipe.stop(join) == 0
    finally:
        pipe.stop_all()
