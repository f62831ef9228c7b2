"""The real OpenTelemetry Collector (``make otelcol``) between an SDK-instrumented service and the real broker.

Real parts only: ``tests/support/otel_service.py`` (opentelemetry-sdk + the OTLP/gRPC exporter, its own
process) → ``otelcol-ttft`` with the committed ``deploy/otel/collector.yaml`` → ``kafkaexporter`` → the
session broker. Each Kafka message holds one ``ExportTraceServiceRequest`` of a single trace, keyed by its
trace id (32 lowercase hex), so all messages of a trace share a partition, the one Kafka's own murmur2
partitioner gives that key.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import murmur2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from streams.otel.collector import DEFAULT_CONFIG, TENANT_OVERLAY, LocalCollector, default_binary, missing_binary
from streams.settings import Settings
from tests.fixtures.otel import OtelCollectorHandle, free_otel_ports

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.otel, pytest.mark.kafka, pytest.mark.timeout(240)]

#: (trace id hex, span id hex, partition) of every span read, and the messages (key, partition) read.
Received = tuple[list[tuple[str, str, int]], list[tuple[str, int]]]


def _span_ids(value: bytes, encoding: str) -> list[tuple[str, str]]:
    """(trace id hex, span id hex) of every span in one message.

    ``otlp_json`` is OTLP's JSON mapping, where ids are hex strings; protobuf's own JSON parser would read
    them as base64, so the JSON form is walked as plain JSON here.
    """
    if encoding == "otlp_json":
        body = json.loads(value)
        return [
            (span["traceId"], span["spanId"])
            for rs in body["resourceSpans"]
            for ss in rs["scopeSpans"]
            for span in ss["spans"]
        ]
    request = ExportTraceServiceRequest.FromString(value)
    return [
        (span.trace_id.hex(), span.span_id.hex())
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


async def _read_spans(handle: OtelCollectorHandle, want: int, encoding: str, timeout_s: float = 60.0) -> Received:
    """Consume the span topic from the start until ``want`` spans were read or ``timeout_s`` passed."""
    consumer = AIOKafkaConsumer(
        handle.topic, bootstrap_servers=handle.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    spans: list[tuple[str, str, int]] = []
    messages: list[tuple[str, int]] = []
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout_s
        while len(spans) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    assert record.key is not None and record.value is not None
                    key = record.key.decode()
                    messages.append((key, record.partition))
                    for trace_id, span_id in _span_ids(record.value, encoding):
                        assert trace_id == key, "a message holds the spans of one trace only"
                        spans.append((key, span_id, record.partition))
    finally:
        await consumer.stop()
    return spans, messages


def _run_service(handle: OtelCollectorHandle, out: Path, traces: int) -> dict[str, object]:
    cmd = [sys.executable, str(REPO / "tests/support/otel_service.py"), "--endpoint", handle.collector.grpc_endpoint]
    cmd += ["--traces", str(traces), "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    truth: dict[str, object] = json.loads(out.read_text())
    return truth


def _histogram_counts(url: str, namespace: str) -> dict[str, float]:
    """``span.name`` → count of that span's duration histogram in ``namespace`` on the Prometheus page."""
    page = urllib.request.urlopen(url, timeout=5).read().decode()
    counts: dict[str, float] = {}
    prefix = f"{namespace}_duration_milliseconds_count{{"
    for line in page.splitlines():
        if line.startswith(prefix):
            labels, value = line[len(prefix) :].rsplit("} ", 1)
            name = next(p.split("=", 1)[1].strip('"') for p in labels.split(",") if p.startswith("span_name="))
            counts[name] = counts.get(name, 0.0) + float(value)
    return counts


def _bucket_bounds(url: str, namespace: str) -> set[str]:
    page = urllib.request.urlopen(url, timeout=5).read().decode()
    prefix = f"{namespace}_duration_milliseconds_bucket{{"
    return {line.split('le="', 1)[1].split('"', 1)[0] for line in page.splitlines() if line.startswith(prefix)}


def test_committed_config_validates(tmp_path: Path) -> None:
    """``otelcol-ttft validate`` accepts deploy/otel/collector.yaml with either encoding, alone and with the
    tenant overlay (deploy/otel/tenant.yaml) merged over it."""
    if problem := missing_binary(default_binary()):
        pytest.fail(problem)
    collector = LocalCollector(tmp_path, ports=free_otel_ports(), kafka_bootstrap="127.0.0.1:9092")
    overlay = ["--config", str(TENANT_OVERLAY)]
    for encoding, extra in (("otlp_proto", []), ("otlp_json", []), ("otlp_proto", overlay)):
        env = {**collector.environment(), "TTFT_OTLP__ENCODING": encoding}
        cmd = [str(default_binary()), "validate", "--config", str(DEFAULT_CONFIG), *extra]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_sdk_traces_reach_kafka_one_partition_per_trace(otel_collector: OtelCollectorHandle, tmp_path: Path) -> None:
    """200 traces of 3 spans from the SDK: every span arrives, each trace on one partition (murmur2 of its
    id), traces exported in two parts included; both spanmetrics histograms count every span."""
    truth = _run_service(otel_collector, tmp_path / "spans.json", traces=200)
    traces: dict[str, list[str]] = truth["traces"]  # type: ignore[assignment]
    split: list[str] = truth["split"]  # type: ignore[assignment]
    sent = {(t, s) for t, ids in traces.items() for s in ids}
    spans, messages = asyncio.run(_read_spans(otel_collector, len(sent), "otlp_proto"))

    assert {(t, s) for t, s, _ in spans} == sent
    assert len(spans) == len(sent), "no span arrives twice"
    partitions: dict[str, set[int]] = defaultdict(set)
    for key, partition in messages:
        partitions[key].add(partition)
    assert all(len(p) == 1 for p in partitions.values())
    n = otel_collector.partitions
    assert all(p == {(murmur2(k.encode()) & 0x7FFFFFFF) % n} for k, p in partitions.items())
    per_trace = defaultdict(int)
    for key, _ in messages:
        per_trace[key] += 1
    assert len(split) == 50 and all(per_trace[t] >= 2 for t in split), "split traces arrive in several messages"
    assert len({p for ps in partitions.values() for p in ps}) == n, "200 trace ids spread over every partition"

    url = otel_collector.collector.metrics_url
    want = {"rag.request": 200.0, "retrieve": 200.0, "chat": 200.0}
    deadline = time.monotonic() + 30.0  # the connectors flush every 5 s
    while time.monotonic() < deadline:
        counts = {ns: _histogram_counts(url, ns) for ns in ("span_metrics_default", "span_metrics_tuned")}
        if all(c == want for c in counts.values()):
            break
        time.sleep(1.0)
    assert counts == {"span_metrics_default": want, "span_metrics_tuned": want}
    default_bounds = _bucket_bounds(url, "span_metrics_default")
    tuned_bounds = _bucket_bounds(url, "span_metrics_tuned")
    assert {"2", "15000", "+Inf"} <= default_bounds and "115" not in default_bounds
    assert {"100", "115", "4800", "5000", "+Inf"} <= tuned_bounds


def test_otlp_http_and_json_encoding(start_otel_collector: Callable[..., OtelCollectorHandle]) -> None:
    """Spans POSTed to the OTLP/HTTP receiver arrive too; with ``otlp_json`` each message is the JSON form."""
    handle = start_otel_collector("otlp_json")
    request = ExportTraceServiceRequest()
    sent: set[tuple[str, str]] = set()
    for _ in range(10):
        trace_id, span_id = os.urandom(16), os.urandom(8)
        now = time.time_ns()
        span = Span(trace_id=trace_id, span_id=span_id, name="chat", start_time_unix_nano=now, end_time_unix_nano=now)
        request.resource_spans.append(ResourceSpans(scope_spans=[ScopeSpans(spans=[span])]))
        sent.add((trace_id.hex(), span_id.hex()))
    post = urllib.request.Request(
        f"{handle.collector.http_endpoint}/v1/traces",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    with urllib.request.urlopen(post, timeout=10) as answer:
        assert answer.status == 200
    spans, messages = asyncio.run(_read_spans(handle, len(sent), "otlp_json"))
    assert {(t, s) for t, s, _ in spans} == sent
    assert len(messages) == 10


def test_cli_up_status_down(kafka_settings: Settings, tmp_path: Path) -> None:
    """``ttft otel up`` starts a detached Collector on the configured ports, ``down`` stops it."""
    ports = free_otel_ports()
    env = {
        **os.environ,
        "TTFT_HOME": str(tmp_path),
        "TTFT_KAFKA_BOOTSTRAP": kafka_settings.kafka_bootstrap,
        **{f"TTFT_OTEL__{name.upper()}": str(port) for name, port in ports.ports().items()},
    }

    def ttft(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "streams.cli.main", "otel", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90, check=False)

    try:
        assert ttft("status").returncode == 1
        up = ttft("up")
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"OTLP gRPC    127.0.0.1:{ports.grpc_port}" in up.stdout
        assert f"http://127.0.0.1:{ports.prometheus_port}/metrics" in up.stdout
        status = ttft("status")
        assert status.returncode == 0 and "runs" in status.stdout
        assert "already up" in ttft("up").stdout
        down = ttft("down")
        assert down.returncode == 0 and "stopped" in down.stdout
        assert ttft("status").returncode == 1
    finally:
        LocalCollector(tmp_path / "otel", ports=ports, kafka_bootstrap=kafka_settings.kafka_bootstrap).stop(timeout_s=5)
