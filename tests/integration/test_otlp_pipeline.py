"""Issue 15: OTLP span messages through the real broker and ``ttft worker`` into the store.

The traces, their split into exports and the expected ``requests`` rows come from
``tests/support/otlp_traffic.py`` (the test's own timings, not the mapping code). The same traces sent as
stage events by the emitter must give identical rows, apart from the ingestion fields named below.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from streams.emit import StageEmitter
from streams.kafka.topics import ensure_named_topics, ensure_topics
from streams.ports import free_port
from streams.settings import Settings
from tests.support.otlp_traffic import (
    TraceSpec,
    build_trace,
    emitter_events,
    exports,
    otlp_json,
    request_message,
    truth_row,
)
from tests.support.pipeline import Pipeline, WorkerProcess, group_lag, pipeline_env, produce_sync

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

N_TRACES = 300
TENANTS = ("acme", "globex")
#: Fields that say how a row was ingested, not what the request was.
INGESTION_FIELDS = frozenset(
    {"inserted_at", "record_version", "duplicate_events", "late_events", "event_count", "event_keys"}
)
SPAN_OUTCOMES = ("stage", "not_stage", "dead_letter")
DEAD_REASONS = ("missing_tenant", "otlp_decode")
#: Epoch-ms floats near 1.8e12 are spaced 2.4e-4 ms apart, so a difference of two (ttft_ms) is exact to that.
TIME_TOLERANCE_MS = 1e-3
STAGE_SPANS = frozenset({"POST /ask", "retrieve", "embed", "rerank", "assemble", "llm"})


def _traces(
    n: int, *, no_tenant: int = 0, as_json: bool = False
) -> tuple[list[TraceSpec], list[tuple[bytes | None, bytes]], int]:
    """Traces, their OTLP messages in export order (several per trace for some), and how many are split."""
    rng = random.Random(15)
    start = int(time.time() * 1e6) - 300_000_000
    specs = [
        build_trace(rng, i + 1, start + i * 30_000, shape=("openinference", "gen_ai")[i % 2], tenant=TENANTS[i % 2])
        for i in range(n)
    ]
    for spec in specs[:no_tenant]:
        spec.tenant_on_resource = False
        for span in spec.spans:
            span.attributes.pop("ttft.tenant_id", None)
    timed: list[tuple[int, int, bytes, bytes]] = []
    split = 0
    for k, spec in enumerate(specs):
        pieces = 1 if rng.random() < 0.6 else rng.randrange(2, 5)
        parts = exports(spec, rng, pieces)
        split += len(parts) > 1
        for part in parts:
            msg = request_message(spec, part)
            value = otlp_json(msg) if as_json else msg.SerializeToString()
            timed.append((max(s.end_us for s in part), k, spec.trace_id.hex().encode(), value))
    timed.sort()
    return specs, [(key, value) for _, _, key, value in timed], split


def _env(settings: Settings, home: Path, **extra: str) -> dict[str, str]:
    base = {
        "TTFT_OTLP__TOPIC": f"{settings.topic_prefix}-otlp_spans",
        "TTFT_JOIN__REQUEST_TIMEOUT_MS": "8000",
        "TTFT_JOIN__CONSUMER": "batch",
    }
    return pipeline_env(settings, home, **{**base, **extra})


def _start(pipe: Pipeline) -> tuple[WorkerProcess, WorkerProcess]:
    writer = pipe.start("writer", free_port())
    join = pipe.start("join", free_port())
    pipe.wait_healthy(writer)
    pipe.wait_healthy(join)
    return join, writer


def _drained(settings: Settings, join: WorkerProcess) -> bool:
    app, b = f"app-{settings.topic_prefix}", settings.kafka_bootstrap
    return (
        group_lag(b, f"{app}-otlp", [f"{settings.topic_prefix}-otlp_spans"]) == 0
        and join.metric("ttft_otlp_traces_held") == 0
        and group_lag(b, f"{app}-join", [settings.topic("stage-events")]) == 0
        and join.metric("ttft_open_requests") == 0
        and group_lag(b, f"{app}-writer", [settings.topic("requests"), settings.topic("dead-letter")]) == 0
    )


def _rows(pipe: Pipeline) -> dict[tuple[str, str], dict[str, Any]]:
    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["tenant_id"], row["request_id"])
        assert key not in by_key, f"double-counted {key}"
        by_key[key] = row
    return by_key


def _check_truth(rows: dict[tuple[str, str], dict[str, Any]], specs: list[TraceSpec]) -> None:
    assert set(rows) == {(s.tenant, s.rid) for s in specs}
    wrong: list[str] = []
    for spec in specs:
        got = rows[(spec.tenant, spec.rid)]
        for key, want in truth_row(spec).items():
            have = got[key]
            ok = (
                math.isclose(have, want, rel_tol=1e-12, abs_tol=TIME_TOLERANCE_MS)
                if isinstance(want, float) and have is not None
                else have == want
            )
            if not ok:
                wrong.append(f"{spec.rid}.{key}: want {want!r} got {have!r}")
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"


async def _emit(settings: Settings, specs: list[TraceSpec]) -> None:
    emitter = StageEmitter(settings.kafka_bootstrap, settings.topic("stage-events"), tenant_id="unused")
    await emitter.start()
    for spec in specs:
        for key, value in emitter_events(spec):
            emitter.enqueue(key, value)
    await emitter.stop()
    assert emitter.stats.sent == sum(len(emitter_events(s)) for s in specs)


def test_otlp_traces_match_ground_truth_and_the_emitter_path(
    kafka_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs, messages, split = _traces(N_TRACES, no_tenant=3)
    messages.append((b"garbage", b"\xff\xfe not an ExportTraceServiceRequest"))
    mapped = specs[3:]
    emitted_settings = kafka_settings.model_copy(
        update={"topic_prefix": f"{kafka_settings.topic_prefix}e", "app_id": f"{kafka_settings.app_id}e"}
    )
    otlp = Pipeline(_env(kafka_settings, tmp_path / "otlp"), tmp_path / "otlp")
    emitted = Pipeline(_env(emitted_settings, tmp_path / "emit"), tmp_path / "emit")
    started = time.monotonic()
    try:
        (tmp_path / "otlp").mkdir()
        (tmp_path / "emit").mkdir()
        # Produced before the workers start: a producer stalling past the grace on a partition the bridge has
        # caught up with would let the idle tick resolve traces before their roots (as it would live).
        otlp_topic = f"{kafka_settings.topic_prefix}-otlp_spans"
        asyncio.run(ensure_named_topics(kafka_settings, {otlp_topic: {}}))
        asyncio.run(ensure_topics(emitted_settings))
        produce_sync(kafka_settings.kafka_bootstrap, otlp_topic, messages)
        asyncio.run(_emit(emitted_settings, mapped))
        join, writer = _start(otlp)
        ejoin, ewriter = _start(emitted)
        otlp.wait_for(lambda: _drained(kafka_settings, join), 180, "the OTLP pipeline to drain")
        emitted.wait_for(lambda: _drained(emitted_settings, ejoin), 180, "the emitter pipeline to drain")
        spans = {
            k: join.metric(f'ttft_otlp_spans_total{{outcome="{k}"}}') for k in ("stage", "not_stage", "dead_letter")
        }
        dead_metric = {
            r: join.metric(f'ttft_dead_letters_total{{reason="{r}"}}') for r in ("missing_tenant", "otlp_decode")
        }
        for worker in (join, writer, ejoin, ewriter):
            assert (otlp if worker in (join, writer) else emitted).stop(worker) == 0
    finally:
        otlp.stop_all()
        emitted.stop_all()
    drained_s = time.monotonic() - started
    rows = _rows(otlp)
    _check_truth(rows, mapped)
    unmappable = sum(1 for spec in specs[:3] for s in spec.spans if s.name in STAGE_SPANS)
    dls = otlp.query("SELECT reason_code, trace_id, span_id FROM {db}.dead_letters FINAL")
    reasons = sorted(d["reason_code"] for d in dls)
    assert reasons == sorted(["otlp_decode"] + ["missing_tenant"] * unmappable)
    assert {d["trace_id"] for d in dls if d["reason_code"] == "missing_tenant"} == {s.trace_id.hex() for s in specs[:3]}
    assert dead_metric == {"missing_tenant": unmappable, "otlp_decode": 1}
    assert spans["dead_letter"] == unmappable and spans["not_stage"] == 2 * N_TRACES
    other = _rows(emitted)
    assert set(other) == set(rows)
    diffs = [
        f"{key}.{col}: otlp {rows[key][col]!r} emitter {other[key][col]!r}"
        for key in rows
        for col in rows[key]
        if col not in INGESTION_FIELDS and rows[key][col] != other[key][col]
    ]
    assert not diffs, f"{len(diffs)} differences, e.g. {diffs[:10]}"
    with capsys.disabled():
        print(
            f"\nOTLP e2e: {len(specs)} traces, {split} split over several exports, {len(messages)} messages, "
            f"{int(spans['stage'])} stage spans, {unmappable} dead-lettered, drained both paths in {drained_s:.1f} s"
        )


def test_join_restart_mid_stream_loses_and_duplicates_nothing(kafka_settings: Settings, tmp_path: Path) -> None:
    """SIGTERM between batches: every request once, exact, nothing counted twice. (kill -9 mid-batch, a
    broker restart, a revocation and a failed produce are in tests/integration/test_otlp_durability.py.)"""
    specs, messages, _ = _traces(N_TRACES)
    # A grace longer than the restart takes: the traces held at the stop stay held (an idle partition's
    # watermark would otherwise resolve them on wall time, before their roots arrive).
    env = _env(kafka_settings, tmp_path, TTFT_JOIN__GRACE_MS="20000", TTFT_JOIN__REQUEST_TIMEOUT_MS="22000")
    pipe = Pipeline(env, tmp_path)
    topic = f"{kafka_settings.topic_prefix}-otlp_spans"
    b, group = kafka_settings.kafka_bootstrap, f"app-{kafka_settings.topic_prefix}-otlp"
    half = len(messages) // 2
    try:
        join, writer = _start(pipe)
        produce_sync(b, topic, messages[:half])
        pipe.wait_for(lambda: group_lag(b, group, [topic]) == 0, 120, "the bridge to commit the first half")
        held = join.metric("ttft_otlp_traces_held")
        assert pipe.stop(join, signal.SIGTERM) == 0
        produce_sync(b, topic, messages[half:])
        join = pipe.start("join", free_port())
        pipe.wait_healthy(join)
        pipe.wait_for(lambda: _drained(kafka_settings, join), 180, "the pipeline to drain after the restart")
        assert pipe.stop(join) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    assert held > 0, "the restart should find traces held mid-stream"
    rows = _rows(pipe)
    _check_truth(rows, specs)
    assert all(r["duplicate_events"] == 0 for r in rows.values())
    assert pipe.query("SELECT count() AS n FROM {db}.dead_letters")[0]["n"] == 0


def test_otlp_json_encoding_gives_the_same_rows(kafka_settings: Settings, tmp_path: Path) -> None:
    specs, messages, _ = _traces(60, as_json=True)
    pipe = Pipeline(_env(kafka_settings, tmp_path, TTFT_OTLP__ENCODING="otlp_json"), tmp_path)
    topic = f"{kafka_settings.topic_prefix}-otlp_spans"
    asyncio.run(ensure_named_topics(kafka_settings, {topic: {}}))
    produce_sync(kafka_settings.kafka_bootstrap, topic, messages)
    try:
        join, writer = _start(pipe)
        pipe.wait_for(lambda: _drained(kafka_settings, join), 180, "the OTLP/JSON pipeline to drain")
        assert pipe.stop(join) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    _check_truth(_rows(pipe), specs)
    assert pipe.query("SELECT count() AS n FROM {db}.dead_letters")[0]["n"] == 0
