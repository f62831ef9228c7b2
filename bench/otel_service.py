"""The spanmetrics comparison's service: an OpenTelemetry-SDK process exporting OTLP/gRPC with known durations.

Each trace: a root ``rag.request`` span (``ttft.tenant_id``), a ``retrieve`` child (OpenInference
``RETRIEVER``) and a ``chat`` child (GenAI ``chat``) with a ``gen_ai.first_chunk`` event; the chat span goes
on streaming 0.5–5 s after its first chunk, so its whole duration is not the time to first chunk. Every
timestamp is explicit (nothing sleeps). The ground truth, in integer nanoseconds, goes to ``--out``::

    {"retrieval_ns": [...], "first_chunk_ns": [...], "llm_span_ns": [...]}

Usage: ``python -m bench.otel_service --endpoint 127.0.0.1:4317 --traces 3000 --out truth.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context

_MS = 1_000_000  # nanoseconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True, help="OTLP/gRPC host:port of the Collector")
    parser.add_argument("--traces", type=int, default=3_000)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    provider = TracerProvider(resource=Resource.create({"service.name": "rag-bench", "service.version": "v1"}))
    exporter = OTLPSpanExporter(endpoint=f"http://{args.endpoint}", insecure=True, timeout=30)
    # The queue holds every span: a span dropped here would be missing from both sides of the comparison.
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, max_queue_size=3 * args.traces + 1024, schedule_delay_millis=100, max_export_batch_size=512
        )
    )
    tracer = provider.get_tracer("ttft.bench.spanmetrics")
    rng = random.Random(args.seed)
    truth: dict[str, list[int]] = {"retrieval_ns": [], "first_chunk_ns": [], "llm_span_ns": []}
    now = time.time_ns() - 60_000 * _MS
    for i in range(args.traces):
        start = now + i * 5 * _MS
        # Long-tailed like real latencies: lognormal, clipped to 100 ms–5 s where both histograms have buckets.
        retrieval = int(min(max(rng.lognormvariate(5.6, 0.45), 100.0), 5_000.0) * _MS)
        first_chunk = int(min(max(rng.lognormvariate(6.6, 0.5), 150.0), 5_000.0) * _MS)
        stream = int(rng.uniform(500.0, 5_000.0) * _MS)
        root = tracer.start_span(
            "rag.request", kind=SpanKind.SERVER, start_time=start, attributes={"ttft.tenant_id": f"tenant-{i % 2}"}
        )
        ctx = set_span_in_context(root)
        r_start = start + 2 * _MS
        retrieve = tracer.start_span(
            "retrieve", context=ctx, start_time=r_start, attributes={"openinference.span.kind": "RETRIEVER"}
        )
        llm_start = r_start + retrieval + 3 * _MS
        chat = tracer.start_span(
            "chat",
            context=ctx,
            kind=SpanKind.CLIENT,
            start_time=llm_start,
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m-small"},
        )
        chat.add_event("gen_ai.first_chunk", timestamp=llm_start + first_chunk)
        retrieve.end(end_time=r_start + retrieval)
        chat.end(end_time=llm_start + first_chunk + stream)
        root.end(end_time=llm_start + first_chunk + stream + 2 * _MS)
        truth["retrieval_ns"].append(retrieval)
        truth["first_chunk_ns"].append(first_chunk)
        truth["llm_span_ns"].append(first_chunk + stream)
    if not provider.force_flush(timeout_millis=60_000):
        raise SystemExit("otel_service: the exporter did not flush within 60 s")
    provider.shutdown()
    args.out.write_text(json.dumps(truth))


if __name__ == "__main__":
    main()
