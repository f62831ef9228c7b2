"""A small RAG service instrumented with the OpenTelemetry SDK, exporting OTLP/gRPC (a separate process).

Each trace is a root ``rag.request`` span with a ``retrieve`` child (OpenInference ``RETRIEVER``) and a
``chat`` child (GenAI ``chat``, with a ``gen_ai.first_chunk`` event); durations of 100 ms–5 s are set by
explicit timestamps. Every ``--split-every``-th trace is split the way real ones are (the LLM and root spans
end last): its retrieval span is exported with the other traces, its LLM and root spans only after a pause
longer than the Collector's batch timeout, so the trace reaches Kafka in two messages or more.

Every ``--late-every``-th other trace (0: none) is delivered as a retrieval service exporting after the root's
would: it also has an ``embed`` span (OpenInference ``EMBEDDING``) under its retrieval span and a ``prompt``
span (``ttft.stage = prompt_assemble``, ``PROMPT_MS`` long, between the retrieval's end and the LLM span's
start, ``DERIVED_MS``), exported in four parts, a pause apart: the embedding span; the LLM and root spans; the
retrieval span; the prompt span. The spans it made are written to ``--out`` as JSON, the ground truth the test
compares with what reaches Kafka::

    {"traces": {trace_id_hex: [span_id_hex, ...]}, "split": [trace_id_hex, ...], "late": [trace_id_hex, ...]}

Usage: ``python tests/support/otel_service.py --endpoint 127.0.0.1:4317 --traces 200 --out spans.json``.
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
from opentelemetry.trace import Span, SpanKind, Tracer, set_span_in_context

_MS = 1_000_000  # nanoseconds
#: A late trace's gap from its retrieval span's end to its LLM span's start (a derived prompt assembly's length),
#: and its prompt span's length inside that gap.
DERIVED_MS = 58.0
PROMPT_MS = 48.0


def _one_trace(
    tracer: Tracer, rng: random.Random, start_ns: int, tenant: str, late: bool = False
) -> tuple[str, list[str], list[tuple[Span, int]]]:
    """Start a trace's spans; returns its trace id, span ids and the spans in the order they should end (``late``:
    with an embedding and a prompt span, ending embedding, LLM, root, retrieval, prompt)."""
    retrieval_ms = rng.uniform(100, 600)
    first_chunk_ms = rng.uniform(300, 2_000)
    stream_ms = rng.uniform(500, 3_000)
    root = tracer.start_span(
        "rag.request", kind=SpanKind.SERVER, start_time=start_ns, attributes={"ttft.tenant_id": tenant}
    )
    ctx = set_span_in_context(root)
    retrieve = tracer.start_span(
        "retrieve", context=ctx, start_time=start_ns + 2 * _MS, attributes={"openinference.span.kind": "RETRIEVER"}
    )
    llm_start = start_ns + int((retrieval_ms + 60) * _MS)
    chat = tracer.start_span(
        "chat",
        context=ctx,
        kind=SpanKind.CLIENT,
        start_time=llm_start,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m-small"},
    )
    chat.add_event("gen_ai.first_chunk", timestamp=llm_start + int(first_chunk_ms * _MS))
    ends = [
        (retrieve, start_ns + int((2 + retrieval_ms) * _MS)),
        (chat, llm_start + int((first_chunk_ms + stream_ms) * _MS)),
        (root, llm_start + int((first_chunk_ms + stream_ms + 5) * _MS)),
    ]
    spans = [root, retrieve, chat]
    if late:
        retrieved_ns = ends[0][1]
        embed = tracer.start_span(
            "embed",
            context=set_span_in_context(retrieve),
            start_time=start_ns + 3 * _MS,
            attributes={"openinference.span.kind": "EMBEDDING"},
        )
        prompt = tracer.start_span(
            "prompt",
            context=ctx,
            start_time=retrieved_ns + 5 * _MS,
            attributes={"ttft.stage": "prompt_assemble"},
        )
        ends = [
            (embed, start_ns + 40 * _MS),
            ends[1],
            ends[2],
            ends[0],
            (prompt, retrieved_ns + int((5 + PROMPT_MS) * _MS)),
        ]
        spans += [embed, prompt]
    trace_id = format(root.get_span_context().trace_id, "032x")
    span_ids = [format(s.get_span_context().span_id, "016x") for s in spans]
    return trace_id, span_ids, ends


def _flush(provider: TracerProvider) -> None:
    if not provider.force_flush(timeout_millis=30_000):
        raise SystemExit("otel_service: the exporter did not flush within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True, help="OTLP/gRPC host:port of the Collector")
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--split-every", type=int, default=4)
    parser.add_argument("--pause-s", type=float, default=1.0, help="between a split trace's two exports")
    parser.add_argument("--late-every", type=int, default=0, help="traces delivered in four parts (0: none)")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    provider = TracerProvider(resource=Resource.create({"service.name": "rag-api", "service.version": "v1"}))
    exporter = OTLPSpanExporter(endpoint=f"http://{args.endpoint}", insecure=True, timeout=30)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100, max_export_batch_size=256))
    tracer = provider.get_tracer("ttft.tests.otel_service")
    rng = random.Random(args.seed)
    traces: dict[str, list[str]] = {}
    split: list[str] = []
    late: list[str] = []
    # The spans to end in each export after the first (a pause apart, past the Collector's batch timeout).
    phases: list[list[tuple[Span, int]]] = [[], [], []]
    now = time.time_ns()
    for i in range(args.traces):
        is_split = bool(args.split_every) and i % args.split_every == 0
        is_late = not is_split and bool(args.late_every) and i % args.late_every == 1
        trace_id, span_ids, ends = _one_trace(tracer, rng, now + i * 10 * _MS, f"tenant-{i % 2}", is_late)
        traces[trace_id] = span_ids
        if is_split:
            split.append(trace_id)
            ends, deferred = ends[:1], ends[1:]
            phases[0] += deferred
        elif is_late:
            late.append(trace_id)
            ends, llm_root, retrieval, prompt = ends[:1], ends[1:3], ends[3:4], ends[4:]
            phases[0] += llm_root
            phases[1] += retrieval
            phases[2] += prompt
        for span, end_ns in ends:
            span.end(end_time=end_ns)
    _flush(provider)
    for phase in phases:
        if not phase:
            continue
        time.sleep(args.pause_s)  # past the Collector's batch timeout: these spans go in other batches
        for span, end_ns in phase:
            span.end(end_time=end_ns)
        _flush(provider)
    provider.shutdown()
    args.out.write_text(json.dumps({"traces": traces, "split": split, "late": late}))


if __name__ == "__main__":
    main()
