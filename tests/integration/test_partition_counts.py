"""Input topics with more partitions than ``TTFT_PARTITIONS`` (created by hand, or grown to scale out, as
docs/operations.md allows): the join takes their count, grows its changelogs, and stores every request.

Before (streams/app/partition_fit.py), the join wrote state to changelog partitions that did not exist:
it exited on restoring them after a 40 s timeout, and again after every restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from streams.alerting.outbox import topic_partitions
from streams.kafka.topics import ensure_named_topics
from streams.ports import free_port
from tests.support.pipeline import Pipeline, group_lag, pipeline_env, produce
from tests.support.traffic import build_traffic, wrong_values

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(240)]

GROWN = 12


def test_the_join_follows_input_topics_grown_past_the_setting(kafka_settings: Any, tmp_path: Path) -> None:
    assert kafka_settings.partitions < GROWN
    events, otlp_topic = kafka_settings.topic("stage-events"), f"{kafka_settings.topic_prefix}.otlp_spans"
    asyncio.run(ensure_named_topics(kafka_settings, {events: {}}, partitions=GROWN))
    asyncio.run(ensure_named_topics(kafka_settings, {otlp_topic: {}}, partitions=GROWN))
    now = time.time() * 1000
    traffic = build_traffic(400, seed=8, start_ms=now - 60_000, malformed_share=0.0, orphan_share=0.0, prefix="g")
    app, bootstrap = f"app-{kafka_settings.topic_prefix}", kafka_settings.kafka_bootstrap

    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path, TTFT_OTLP__TOPIC=otlp_topic), tmp_path)
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        asyncio.run(produce(bootstrap, events, traffic.messages))
        pipe.wait_for(
            lambda: (
                group_lag(bootstrap, f"{app}-join", [events]) == 0
                and join.metric("ttft_open_requests") == 0
                and group_lag(bootstrap, f"{app}-writer", [kafka_settings.topic("requests")]) == 0
            ),
            120,
            "the pipeline to drain",
        )
        assert join.alive() and writer.alive()
        log = join.log()
        assert f"topic {events} has {GROWN} partitions, TTFT_PARTITIONS says {kafka_settings.partitions}" in log, log
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()

    for changelog in (f"{app}-join-join-state-changelog", f"{app}-otlp-traces-changelog"):
        assert len(asyncio.run(topic_partitions(kafka_settings, changelog))) == GROWN, changelog
    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_id = {row["request_id"]: row for row in rows}
    assert set(by_id) == set(traffic.truth)
    wrong = wrong_values(by_id, traffic.truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"
