"""Producers compress: kcat (librdkafka) writes the input in gzip, lz4, snappy and zstd batches, and the real
join and writer store every request exactly.

librdkafka, the Java client and the Collector's Kafka exporter all offer the four codecs, and many services
turn one on. aiokafka decodes lz4, snappy and zstd only with ``cramjam`` (the ``aiokafka[lz4,snappy,zstd]``
extras in pyproject.toml): without it every fetch holding such a batch raised ``UnsupportedCodecError``, the
join exited uncommitted, and its restart read the same batch again, for every tenant of the partition.

The real Collector's Kafka exporter compresses too (``producer.compression``): the OTLP bridge reads its zstd
messages through the same consumer. The same test runs the exporter without ``partition_traces_by_id`` (its
default): one bridge still maps every trace, and counts the messages that are not one trace keyed by its id.

Each test reads the broker's log segments to prove the batches really are compressed (librdkafka sends a
batch uncompressed when compressing would not shrink it).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.ports import free_port
from tests.fixtures.otel import OtelCollectorHandle
from tests.support.otel_service import DERIVED_MS, PROMPT_MS
from tests.support.pipeline import Pipeline, WorkerProcess, group_lag, pipeline_drained, pipeline_env
from tests.support.traffic import build_traffic, wrong_values

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(300)]

CODECS = ("gzip", "snappy", "lz4", "zstd")  # Kafka's codec ids 1-4, in order
N_PER_CODEC = 150
KCAT_TIMEOUT_S = 60.0
#: A record batch's header up to its attributes: base offset, length, leader epoch, magic, crc, attributes.
_BATCH_HEADER = struct.Struct(">qiibIh")


def batch_codecs(segment: Path) -> Counter[str]:
    """The codec of every record batch in a Kafka log segment (the low 3 bits of its attributes)."""
    names = ("none", *CODECS)
    data = segment.read_bytes()
    out: Counter[str] = Counter()
    at = 0
    while at + _BATCH_HEADER.size <= len(data):
        _, length, _, magic, _, attributes = _BATCH_HEADER.unpack_from(data, at)
        if length <= 0:
            break  # the preallocated tail of an active segment
        assert magic == 2, f"{segment}: batch at byte {at} has magic {magic}"
        out[names[attributes & 0x07]] += 1
        at += 12 + length  # base offset and length precede the length's span
    return out


def _kcat(kcat: str, bootstrap: str, topic: str, codec: str, path: Path) -> None:
    cmd = [
        kcat, "-P", "-b", bootstrap, "-t", topic, "-z", codec, "-K", "\\t", "-l", str(path),
        "-X", "partitioner=murmur2_random", "-X", "linger.ms=50",
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"kcat did not finish in {KCAT_TIMEOUT_S} s: {cmd}") from exc
    assert done.returncode == 0, f"{cmd} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}"


def test_every_kafka_codec_is_read(kcat: str, kafka_broker: Any, kafka_settings: Any, tmp_path: Path) -> None:
    bootstrap, topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    now = time.time() * 1000
    truth: dict[str, dict[str, Any]] = {}
    files: dict[str, Path] = {}
    for i, codec in enumerate(CODECS):
        traffic = build_traffic(
            N_PER_CODEC, seed=20 + i, start_ms=now - 60_000, malformed_share=0.0, dup_share=0.0, prefix=f"z{codec}"
        )
        truth |= traffic.truth
        files[codec] = tmp_path / f"{codec}.kcat"
        files[codec].write_bytes(b"".join((k or b"") + b"\t" + v + b"\n" for k, v in traffic.messages))

    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        for codec in CODECS:
            _kcat(kcat, bootstrap, topic, codec, files[codec])
        pipe.wait_for(lambda: pipeline_drained(kafka_settings, join), 120, "the pipeline to drain")
        assert join.alive() and writer.alive(), "a worker exited on compressed input"
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()

    segments = sorted((kafka_broker.data_dir / "log").glob(f"{topic}-*/*.log"))
    codecs = sum((batch_codecs(s) for s in segments), Counter())
    print(f"batches on {topic} by codec: {dict(codecs)}")
    assert all(codecs[c] > 0 for c in CODECS), f"kcat did not compress with every codec: {dict(codecs)}"

    rows = pipe.query("SELECT * FROM {db}.requests FINAL")
    by_id = {row["request_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a request was stored twice"
    assert set(by_id) == set(truth), f"lost {len(set(truth) - set(by_id))}, unexpected {set(by_id) - set(truth)}"
    wrong = wrong_values(by_id, truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"
    letters = pipe.query("SELECT reason_code, detail FROM {db}.dead_letters FINAL")
    assert not letters, f"dead letters from valid compressed input: {letters[:5]}"


#: Overlays on deploy/otel/collector.yaml: the exporter compressing its messages, and the exporter without
#: partition_traces_by_id (its default: messages of several traces, no key), with the codec its batches have
#: and whether the bridge counts its messages as not keyed by their trace.
COLLECTOR_VARIANTS = {
    "zstd": ("exporters:\n  kafka:\n    producer:\n      compression: zstd\n", "zstd", False),
    "unkeyed": ("exporters:\n  kafka:\n    partition_traces_by_id: false\n", "none", True),
}
N_TRACES = 200


def _otlp_drained(settings: Any, join: WorkerProcess, otlp_topic: str) -> bool:
    app, b = f"app-{settings.topic_prefix}", settings.kafka_bootstrap
    return group_lag(b, f"{app}-otlp", [otlp_topic]) == 0 and join.metric("ttft_otlp_traces_held") == 0


@pytest.mark.otel
@pytest.mark.parametrize("variant", sorted(COLLECTOR_VARIANTS))
def test_collector_exports_are_joined(
    variant: str,
    start_otel_collector: Callable[..., OtelCollectorHandle],
    kafka_broker: Any,
    kafka_settings: Any,
    tmp_path: Path,
) -> None:
    """The real Collector with ``producer.compression: zstd``, or without ``partition_traces_by_id``, in front
    of one OTLP bridge: every trace of an SDK-instrumented service (tests/support/otel_service.py) becomes its
    request, with its TTFT; the messages that are not one trace keyed by its id are counted."""
    config, codec, unkeyed = COLLECTOR_VARIANTS[variant]
    overlay = tmp_path / "exporter.yaml"
    overlay.write_text(config)
    handle = start_otel_collector(overlays=(overlay,))
    out = tmp_path / "spans.json"
    cmd = [sys.executable, str(REPO / "tests/support/otel_service.py"), "--endpoint", handle.collector.grpc_endpoint]
    done = subprocess.run(
        [*cmd, "--traces", str(N_TRACES), "--late-every", "5", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    truth = json.loads(out.read_text())
    traces: dict[str, list[str]] = truth["traces"]

    home = tmp_path / "pipeline"
    home.mkdir()
    pipe = Pipeline(pipeline_env(kafka_settings, home, TTFT_OTLP__TOPIC=handle.topic), home)
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        pipe.wait_for(
            lambda: _otlp_drained(kafka_settings, join, handle.topic) and pipeline_drained(kafka_settings, join),
            150,
            "the OTLP pipeline to drain",
        )
        outcomes = {k: join.metric(f'ttft_otlp_spans_total{{outcome="{k}"}}') for k in ("stage", "not_stage", "nested")}
        not_one_trace = join.metric("ttft_otlp_unkeyed_messages_total")
        said = "is not one trace keyed by its id" in join.log()
        assert join.alive() and writer.alive(), "a worker exited on compressed spans"
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()

    segments = sorted((kafka_broker.data_dir / "log").glob(f"{handle.topic}-*/*.log"))
    codecs = sum((batch_codecs(s) for s in segments), Counter())
    print(f"batches on {handle.topic} by codec: {dict(codecs)}; spans {outcomes}; unkeyed {not_one_trace}")
    assert codecs[codec] > 0 and set(codecs) == {codec}, f"the batches' codecs: {dict(codecs)}"
    assert (not_one_trace > 0, said) == (unkeyed, unkeyed), (not_one_trace, said)
    assert sum(outcomes.values()) == sum(len(spans) for spans in traces.values())

    rows = pipe.query("SELECT tenant_id, request_id, status, ttft_ms FROM {db}.requests FINAL")
    assert {r["request_id"] for r in rows} == set(traces) and len(rows) == len(traces)
    assert Counter(r["tenant_id"] for r in rows) == {"tenant-0": N_TRACES // 2, "tenant-1": N_TRACES // 2}
    assert Counter(r["status"] for r in rows) == {"complete": N_TRACES} and all(r["ttft_ms"] > 0 for r in rows)
    _check_late_traces(pipe, truth["late"])


def _check_late_traces(pipe: Pipeline, late: list[str]) -> None:
    """The traces delivered as a retrieval service exporting after the root's (embedding span; LLM and root;
    retrieval; prompt span: tests/support/otel_service.py): each has its vector recall, and one prompt assembly,
    the prompt span's or, when the retrieval span came before it, the derived one (never the two added)."""
    rows = pipe.query(
        "SELECT request_id, vector_recall_ms, prompt_assemble_ms, stage_repeats FROM {db}.requests FINAL "
        f"WHERE request_id IN ({', '.join(repr(t) for t in late)})"
    )
    assert len(late) >= 30 and len(rows) == len(late)
    assert all(r["vector_recall_ms"] is not None for r in rows), [r for r in rows if r["vector_recall_ms"] is None]
    assert all(not r["stage_repeats"] for r in rows), [r for r in rows if r["stage_repeats"]]
    prompts = Counter(
        "derived" if abs(r["prompt_assemble_ms"] - DERIVED_MS) < 0.01 else "span"
        for r in rows
        if abs(r["prompt_assemble_ms"] - DERIVED_MS) < 0.01 or abs(r["prompt_assemble_ms"] - PROMPT_MS) < 0.01
    )
    print(f"late traces' prompt assemblies: {dict(prompts)}")
    assert sum(prompts.values()) == len(rows), [r["prompt_assemble_ms"] for r in rows]
