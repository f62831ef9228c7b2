"""Issue 27, items 1 and 2, through the real broker and ``ttft worker``: hostile OTLP spans of one tenant
mixed into good traffic are dead-lettered with their trace and span ids, the worker never exits, and the
good tenants' rows are exactly what their spans say.

Before the fix each of these crash-looped the join process (the bridge's exception ended it uncommitted,
and the restart read the same message again): span times near 2**64 (orjson's "Integer exceeds 64-bit
range" on the trace state), an LLM span ending before it starts with a huge first chunk (OverflowError), a
trace of 300 spans with 2 KB attributes each (a changelog value past the producer's batch); and one span of
another tenant ending in the future moved the watermark of every held trace of its partition.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from streams.kafka.topics import ensure_named_topics
from streams.settings import Settings
from tests.integration.test_otlp_pipeline import _check_truth, _drained, _env, _rows, _start, _traces
from tests.support.otlp_traffic import SpanSpec, TraceSpec, build_trace, request_message
from tests.support.pipeline import Pipeline, produce_sync

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

NEAR_2_64_US = (2**64 - 1) // 1000


def _mallory(rng: random.Random, i: int) -> TraceSpec:
    start = int(time.time() * 1e6) - 200_000_000
    while True:
        spec = build_trace(rng, i, start, shape="gen_ai", tenant="mallory")
        if spec.llm is not None:
            spec.tenant_on_resource = True
            return spec


def _child(spec: TraceSpec, rng: random.Random, name: str, **attrs: object) -> SpanSpec:
    root = next(s for s in spec.spans if s.parent == b"")
    llm = next(s for s in spec.spans if s.name == "llm")
    return SpanSpec(rng.randbytes(8), root.span_id, name, llm.start_us, llm.end_us, dict(attrs))


def _hostile(now_us: int) -> tuple[list[tuple[bytes | None, bytes]], dict[str, str]]:
    """Hostile messages of tenant ``mallory``, and the reason expected per dead-lettered span id."""
    rng = random.Random(27)
    messages: list[tuple[bytes | None, bytes]] = []
    want: dict[str, str] = {}

    def send(spec: TraceSpec, spans: list[SpanSpec]) -> None:
        messages.append((spec.trace_id.hex().encode(), request_message(spec, spans).SerializeToString()))

    spec = _mallory(rng, 1)
    huge = _child(spec, rng, "huge-times", **{"ttft.stage": "retrieval"})
    huge.start_us, huge.end_us = NEAR_2_64_US - 10, NEAR_2_64_US
    backwards = _child(spec, rng, "backwards", **{"gen_ai.operation.name": "chat"})
    backwards.attributes["gen_ai.response.time_to_first_chunk"] = 1e300
    backwards.end_us = backwards.start_us - 5
    nan = _child(spec, rng, "nan", **{"ttft.stage": "rerank", "ttft.fallback_level": float("nan")})
    big = _child(spec, rng, "big", **{"ttft.stage": "rerank", "ttft.route": "r" * 600_000})
    send(spec, [huge, backwards, nan, big])
    want |= {huge.span_id.hex(): "schema", backwards.span_id.hex(): "schema", nan.span_id.hex(): "schema"}
    want[big.span_id.hex()] = "too_large"
    # 300 held spans with 2 KB attributes each, over three messages: past the trace's 256 KiB budget
    wide = _mallory(rng, 2)
    blobs = [_child(wide, rng, f"blob-{k}", **{"ttft.stage": "rerank", "ttft.blob": "x" * 2_000}) for k in range(300)]
    for k in range(0, 300, 100):
        send(wide, blobs[k : k + 100])
    # one span of mallory ending 30 s ahead (within the skew limit: the lead bound applies)
    ahead = _mallory(rng, 3)
    future = _child(ahead, rng, "ahead", **{"ttft.stage": "rerank"})
    future.start_us, future.end_us = now_us + 20_000_000, now_us + 30_000_000
    send(ahead, [future])
    return messages, want


def test_hostile_spans_are_dead_lettered_and_the_worker_and_other_tenants_go_on(
    kafka_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs, good, _ = _traces(60)
    hostile, want = _hostile(int(time.time() * 1e6))
    # hostile first on every partition, then the good traffic, then the hostile again
    messages = hostile + good + hostile
    pipe = Pipeline(_env(kafka_settings, tmp_path), tmp_path)
    topic = f"{kafka_settings.topic_prefix}-otlp_spans"
    asyncio.run(ensure_named_topics(kafka_settings, {topic: {}}))
    produce_sync(kafka_settings.kafka_bootstrap, topic, messages)
    started = time.monotonic()
    try:
        join, writer = _start(pipe)
        pipe.wait_for(lambda: _drained(kafka_settings, join), 180, "the pipeline to drain past the hostile spans")
        dead_spans = join.metric('ttft_otlp_spans_total{outcome="dead_letter"}')
        assert pipe.stop(join) == 0  # the same process all along: a crash would have ended the wait above
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    drained_s = time.monotonic() - started
    rows = _rows(pipe)
    good_rows = {k: v for k, v in rows.items() if k[0] != "mallory"}
    _check_truth(good_rows, specs)
    dls = pipe.query("SELECT reason_code, trace_id, span_id FROM {db}.dead_letters FINAL")
    by_span = {d["span_id"]: d["reason_code"] for d in dls}
    assert {s: by_span.get(s) for s in want} == want
    assert all(d["trace_id"] and d["span_id"] for d in dls)
    over_budget = {d["span_id"] for d in dls if d["reason_code"] == "too_many_events"}
    assert 100 <= len(over_budget) < 300  # the wide trace kept what fits its budget
    with capsys.disabled():
        print(
            f"\nOTLP hostile: {len(messages)} messages ({2 * len(hostile)} hostile), {len(dls)} dead letters "
            f"({int(dead_spans)} spans counted), {len(good_rows)} good rows exact, drained in {drained_s:.1f} s"
        )
