"""A record the Kafka client cannot read does not stop the pipeline: kcat (librdkafka) sends records whose
header key is not UTF-8 (the broker takes them; aiokafka cannot parse them) to the stage events, the span
topic and the writer's own requests topic, between good traffic. Each becomes a ``not_utf8`` dead letter at
its offset, every good request is stored exactly, and neither worker restarts.

Before (streams/kafka/unreadable.py), the first such record raised out of every fetch: the join exited
uncommitted and its restart failed at the same record, for every tenant on the partition.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.kafka.topics import ensure_named_topics
from streams.ports import free_port
from tests.support.pipeline import Pipeline, WorkerProcess, group_lag, pipeline_env
from tests.support.traffic import build_traffic, wrong_values

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(300)]

BAD_HEADER = b"\xff\xfeproducer=svc-a"  # kcat -H name=value: the name is not UTF-8
KCAT_TIMEOUT_S = 60.0


def _kcat(kcat: str, bootstrap: str, topic: str, path: Path, *args: bytes) -> None:
    cmd = [kcat.encode(), b"-P", b"-b", bootstrap.encode(), b"-t", topic.encode(), *args, b"-l", str(path).encode()]
    done = subprocess.run(cmd, capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"


async def _ends(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


def _bad(kcat: str, bootstrap: str, tp: TopicPartition, path: Path, key: bytes, value: bytes) -> tuple[str, int, range]:
    """One record with the bad header key on ``tp``; returns (topic, partition, the offsets it may have: the
    join's heartbeats share the requests topic)."""
    offset = asyncio.run(_ends(bootstrap, [tp]))[tp]
    path.write_bytes(key + b"\t" + value + b"\n")
    _kcat(kcat, bootstrap, tp.topic, path, b"-K", b"\t", b"-p", str(tp.partition).encode(), b"-H", BAD_HEADER)
    return tp.topic, tp.partition, range(offset, asyncio.run(_ends(bootstrap, [tp]))[tp])


def _settled(settings: Any, join: WorkerProcess, otlp_topic: str) -> bool:
    app, b = f"app-{settings.topic_prefix}", settings.kafka_bootstrap
    return (
        group_lag(b, f"{app}-join", [settings.topic("stage-events")]) == 0
        and group_lag(b, f"{app}-otlp", [otlp_topic]) == 0
        and join.metric("ttft_open_requests") == 0
        and group_lag(b, f"{app}-writer", [settings.topic("requests"), settings.topic("dead-letter")]) == 0
    )


def test_unreadable_records_are_dead_lettered_and_the_rest_flows(
    kcat: str, kafka_settings: Any, tmp_path: Path
) -> None:
    bootstrap, events = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    otlp_topic = f"{kafka_settings.topic_prefix}.otlp_spans"
    asyncio.run(ensure_named_topics(kafka_settings, {otlp_topic: {}}))
    now = time.time() * 1000
    before = build_traffic(200, seed=5, start_ms=now - 60_000, malformed_share=0.0, prefix="u-before")
    after = build_traffic(200, seed=6, start_ms=now - 30_000, malformed_share=0.0, prefix="u-after")
    for name, traffic in (("before", before), ("after", after)):
        (tmp_path / f"{name}.kcat").write_bytes(b"".join(k + b"\t" + v + b"\n" for k, v in traffic.messages))
    lost = {"request_id": "u-lost", "tenant_id": "acme", "stage": "request_start", "ts_ms": now - 20_000}

    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path, TTFT_OTLP__TOPIC=otlp_topic), tmp_path)
    murmur2 = (b"-K", b"\t", b"-X", b"partitioner=murmur2_random")
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        pids = (join.proc.pid, writer.proc.pid)
        _kcat(kcat, bootstrap, events, tmp_path / "before.kcat", *murmur2)
        bad = [
            _bad(kcat, bootstrap, TopicPartition(events, 0), tmp_path / "b0", b"u-lost", orjson.dumps(lost)),
            _bad(kcat, bootstrap, TopicPartition(events, 0), tmp_path / "b1", b"u-lost", orjson.dumps(lost)),
            _bad(kcat, bootstrap, TopicPartition(events, 1), tmp_path / "b2", b"u-lost", orjson.dumps(lost)),
            _bad(kcat, bootstrap, TopicPartition(otlp_topic, 0), tmp_path / "b3", b"0" * 32, b"\x12\x00"),
            _bad(kcat, bootstrap, TopicPartition(kafka_settings.topic("requests"), 2), tmp_path / "b4", b"r", b"{}"),
        ]
        _kcat(kcat, bootstrap, events, tmp_path / "after.kcat", *murmur2)
        pipe.wait_for(lambda: _settled(kafka_settings, join, otlp_topic), 120, "the pipeline to drain")
        assert (join.proc.pid, writer.proc.pid) == pids and join.alive() and writer.alive(), "a worker restarted"
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()

    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_id = {row["request_id"]: row for row in rows}
    truth = {**before.truth, **after.truth}
    assert set(by_id) == set(truth), f"lost {set(truth) - set(by_id)}, unexpected {set(by_id) - set(truth)}"
    wrong = wrong_values(by_id, truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"

    letters = pipe.query(
        "SELECT reason_code, source_topic, source_partition, source_offset, detail FROM {db}.dead_letters FINAL"
    )
    assert len(letters) == len(bad), letters
    for topic, partition, offsets in bad:
        at = [d for d in letters if (d["source_topic"], d["source_partition"]) == (topic, partition)]
        assert any(d["source_offset"] in offsets for d in at), (topic, partition, offsets, letters)
    assert [len(o) for _, _, o in bad[:4]] == [1, 1, 1, 1]  # nothing else writes there: the exact offset
    assert all(d["reason_code"] == "not_utf8" and "header key is not UTF-8" in d["detail"] for d in letters), letters
    print(f"{len(bad)} unreadable records dead-lettered; {len(by_id)} requests stored; e.g. {letters[0]['detail']}")
