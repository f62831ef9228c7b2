"""A transactional producer writes the input: the real join and writer store what it committed, none of
what it aborted, finish the requests of the last transaction on the idle tick, and leave no lag.

Services that produce in transactions (Spring's ``KafkaTemplate`` with a transaction id prefix, Kafka
Streams and Flink with exactly-once) follow every transaction with a commit or abort marker: a control
record that takes an offset and that no consumer ever receives. A worker that judged "caught up" by the
offset after its last record never saw the partition catch up, so the wall-clock idle tick never moved
its watermark: after the traffic stopped, the last requests stayed open, the writer's windows waited, and
the consumer lag stayed at one per partition. Read uncommitted, the aborted events were also stored.

The producer is aiokafka's transactional producer (the broker writes the markers).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from streams.ports import free_port
from tests.support.pipeline import Pipeline, pipeline_drained, pipeline_env
from tests.support.traffic import build_traffic, wrong_values

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(300)]

N_COMMITTED = 300
N_ABORTED = 40
PER_TRANSACTION = 100


async def _produce(
    bootstrap: str, topic: str, committed: list[tuple[bytes, bytes]], aborted: list[tuple[bytes, bytes]]
) -> None:
    """``committed`` in transactions of ``PER_TRANSACTION`` messages; ``aborted`` in one transaction that
    is aborted, between them; keyed, on the partition Kafka's own partitioner gives."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id="ttft-test-tx", partitioner=DefaultPartitioner()
    )
    await producer.start()
    try:
        half = len(committed) // 2
        for part in (committed[:half], aborted, committed[half:]):
            for i in range(0, len(part), PER_TRANSACTION):
                await producer.begin_transaction()
                for key, value in part[i : i + PER_TRANSACTION]:
                    await producer.send(topic, value, key=key)
                if part is aborted:
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
    finally:
        await producer.stop()


def test_transactional_input_commits_catch_up_and_aborts_vanish(kafka_settings: Any, tmp_path: Path) -> None:
    bootstrap, topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    now = time.time() * 1000
    # The last requests start a few seconds before now: only the idle tick can pass their grace.
    good = build_traffic(
        N_COMMITTED,
        seed=3,
        start_ms=now - 6_000,
        spacing_ms=10.0,
        malformed_share=0.0,
        missing_share=0.0,
        orphan_share=0.0,
        prefix="tx",
    )
    bad = build_traffic(
        N_ABORTED,
        seed=4,
        start_ms=now - 6_000,
        malformed_share=0.0,
        missing_share=0.0,
        orphan_share=0.0,
        prefix="tx-aborted",
    )

    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        asyncio.run(_produce(bootstrap, topic, good.messages, bad.messages))
        started = time.monotonic()
        pipe.wait_for(
            lambda: pipeline_drained(kafka_settings, join), 60, "the last requests to close and the lag to clear"
        )
        settled_s = time.monotonic() - started
        assert join.alive() and writer.alive()
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    print(f"transactional input settled {settled_s:.1f} s after the last commit")

    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a request was stored twice"
    aborted = set(bad.truth) & set(by_id)
    assert not aborted, f"{len(aborted)} requests of the aborted transaction were stored"
    assert set(by_id) == set(good.truth), f"lost {len(set(good.truth) - set(by_id))}"
    wrong = wrong_values(by_id, good.truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"
