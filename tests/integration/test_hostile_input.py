"""Issue 14: hostile-but-valid input through the real broker and one ``ttft worker --role all``.

One small, hand-built stream holds every hostile shape this file covers, next to well-formed requests;
the worker must never restart, each hostile event must end in ``dead_letters`` with its reason (or in
its own request's row), and the well-formed requests must be stored exactly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner

from streams.ports import free_port
from tests.support.pipeline import Pipeline, pipeline_drained, pipeline_env, produce_sync
from tests.support.records import make_record

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(300)]


def _request(rid: str, t0: float, tenant: str = "good", **overrides: Any) -> list[dict[str, Any]]:
    """The five required events of a complete request (retrieval 100 ms unless overridden)."""
    base = {"request_id": rid, "tenant_id": tenant, "version_id": "v1"}
    retrieval = {"stage": "retrieval", "ts_ms": t0 + 5, "duration_ms": 100.0, "event_id": f"{rid}-r"}
    return [
        {**base, "stage": "request_start", "ts_ms": t0, "event_id": f"{rid}-s"},
        {**base, **retrieval, **overrides},
        {**base, "stage": "prompt_assemble", "ts_ms": t0 + 110, "duration_ms": 40.0, "event_id": f"{rid}-p"},
        {**base, "stage": "llm_ttft", "ts_ms": t0 + 150, "duration_ms": 700.0, "event_id": f"{rid}-l"},
        {**base, "stage": "first_token", "ts_ms": t0 + 860, "event_id": f"{rid}-f"},
    ]


def _msg(event: dict[str, Any]) -> tuple[bytes, bytes]:
    return event["request_id"].encode(), orjson.dumps(event)


def _same_partition(key: str, partitions: int, prefix: str, count: int) -> list[str]:
    """``count`` request ids that the default partitioner puts on ``key``'s partition."""
    target = DefaultPartitioner()(key.encode(), list(range(partitions)), list(range(partitions)))
    out: list[str] = []
    i = 0
    while len(out) < count:
        rid = f"{prefix}-{i}"
        if DefaultPartitioner()(rid.encode(), list(range(partitions)), list(range(partitions))) == target:
            out.append(rid)
        i += 1
    return out


def _clock_attack(now: float, partitions: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    """An in-flight good request split around a skewed burst on its own partition: (before, burst + after)."""
    inflight = _request("g-inflight", now - 5_000)
    skewed, ahead = (
        _same_partition("g-inflight", partitions, "skew", 6)[:1],
        _same_partition("g-inflight", partitions, "ahead", 5),
    )
    burst = [
        _msg(
            {
                "request_id": skewed[0],
                "tenant_id": "hostile",
                "stage": "retrieval",
                "ts_ms": now + 86_400_000,
                "duration_ms": 5.0,
            }
        )
    ]  # 24 h ahead: timestamp_skew
    for rid in ahead:  # 20 s ahead: accepted, but they cannot push the watermark past the clock + 10 s
        burst += [
            _msg({"request_id": rid, "tenant_id": "hostile", "stage": st, "ts_ms": now + 20_000})
            for st in ("request_start", "first_token")
        ]
    return [_msg(e) for e in inflight[:2]], burst + [_msg(e) for e in inflight[2:]]


def _hostile_stream(t0: float) -> tuple[list[tuple[bytes, bytes]], dict[str, int]]:
    """(messages, expected dead letters per reason)."""
    messages: list[tuple[bytes, bytes]] = []
    for i in range(20):
        messages += [_msg(e) for e in _request(f"ok-{i}", t0 + i * 1_000)]
    # Conflicting duplicates, both orders: the 100 ms copy wins either way.
    c1 = _request("c1", t0 + 30_000)
    c1_loser = {**c1[1], "duration_ms": 150.0}
    messages += [_msg(e) for e in c1] + [_msg(c1_loser)]
    c2 = _request("c2", t0 + 31_000)
    c2_loser = {**c2[1], "duration_ms": 150.0}
    messages += [_msg(c2_loser)] + [_msg(e) for e in c2]
    # Duplicate JSON keys: the tenant is given twice.
    dup = _request("d1", t0 + 32_000)[0]
    messages.append((b"d1", orjson.dumps(dup)[:-1] + b',"tenant_id":"other"}'))
    # A constant request id: 3,000 events of "unknown" within 30 s; the first 1,000 are folded.
    for i in range(3_000):
        stage = ("request_start", "retrieval", "llm_ttft", "first_token")[i % 4]
        event: dict[str, Any] = {"request_id": "unknown", "tenant_id": "hostile", "stage": stage}
        event["ts_ms"] = t0 + 40_000 + i * 10
        if stage in ("retrieval", "llm_ttft"):
            event["duration_ms"] = 5.0
        messages.append(_msg(event))
    return messages, {"conflicting_duplicate": 2, "duplicate_key": 1, "too_many_events": 2_000}


def test_hostile_input_is_dead_lettered_and_good_requests_are_exact(kafka_settings: Any, tmp_path: Path) -> None:
    t0 = float(int(time.time() * 1000) - 120_000)
    messages, expected = _hostile_stream(t0)
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), messages)
        before, after = _clock_attack(time.time() * 1000, kafka_settings.partitions)
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), before)
        time.sleep(1)
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), after)
        expected = {**expected, "timestamp_skew": 1}
        # A record the store cannot hold (UInt16 overflow), e.g. replayed from before the events cap.
        bad_row = {**make_record("bad-row", tenant_id="hostile"), "stage_repeats": {"retrieval": 70_000}}
        produce_sync(
            kafka_settings.kafka_bootstrap, kafka_settings.topic("requests"), [(b"bad-row", orjson.dumps(bad_row))]
        )
        expected = {**expected, "store_rejected": 1}
        time.sleep(3)
        pipe.wait_for(lambda: pipeline_drained(kafka_settings, join), 150, "the pipeline to drain")
        counters = {
            name: join.metric(name)
            for name in ("ttft_dead_letters_total", "ttft_duplicate_events_total", "ttft_caps_tripped_total")
        }
        print("JOIN COUNTERS", counters)
        caps = join.metrics()
        assert caps['ttft_caps_tripped_total{cap="events_per_request"}'] == 2_000
        assert caps['ttft_caps_tripped_total{cap="watermark_lead"}'] >= 1
        assert join.alive() and writer.alive()
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    letters = pipe.query("SELECT reason_code, request_id, original, source_offset FROM {db}.dead_letters FINAL")
    reasons: dict[str, int] = {}
    for row in letters:
        reasons[row["reason_code"]] = reasons.get(row["reason_code"], 0) + 1
    print("DEAD LETTERS", reasons)
    assert reasons == expected
    conflicts = {r["request_id"]: r for r in letters if r["reason_code"] == "conflicting_duplicate"}
    assert orjson.loads(conflicts["c1"]["original"])["duration_ms"] == 150.0  # the new copy lost
    assert conflicts["c2"]["original"] == ""  # the earlier copy lost: named by its offset, bytes in Kafka
    rows = pipe.query("SELECT request_id, status, retrieval_ms, duplicate_events, event_count FROM {db}.requests FINAL")
    by_id = {r["request_id"]: r for r in rows}
    assert by_id["c1"]["retrieval_ms"] == by_id["c2"]["retrieval_ms"] == 100.0
    assert by_id["c1"]["duplicate_events"] == by_id["c2"]["duplicate_events"] == 1
    assert all(by_id[f"ok-{i}"]["status"] == "complete" for i in range(20))
    assert "d1" not in by_id and "bad-row" not in by_id
    assert by_id["unknown"]["event_count"] == 1_000
    assert by_id["g-inflight"]["status"] == "complete"  # the skewed burst did not time it out
    rejected = [r for r in letters if r["reason_code"] == "store_rejected"]
    assert rejected[0]["request_id"] == "bad-row" and orjson.loads(rejected[0]["original"])["stage_repeats"]
