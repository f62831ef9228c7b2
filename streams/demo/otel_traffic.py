"""``ttft demo --otel``: one tenant's share of the story sent as OpenTelemetry traces through the Collector.

A separate process (the demo starts it like its workers): it rebuilds the demo's plan from the same
arguments (:func:`streams.demo.plan.plan_demo` is deterministic), keeps the requests of ``--tenant`` and
turns each into one trace made with the OpenTelemetry SDK, exported over OTLP/gRPC to the Collector, which
writes it to Kafka (``otlp_spans``) for the join's OTLP input (docs/otlp-mapping.md). The spans have the
shapes a real instrumented RAG service gives:

- the root ``rag.request`` span (SERVER): the request's start;
- ``retrieve`` (OpenInference ``RETRIEVER``) with its children ``embed`` (``EMBEDDING`` inside the
  retriever: ``vector_recall``), ``bm25`` (``ttft.stage=bm25_recall``) and ``rerank`` (``RERANKER``);
- ``assemble_prompt`` (``ttft.stage=prompt_assemble``);
- one GenAI ``chat`` span per LLM attempt (``gen_ai.operation.name=chat``, a ``gen_ai.first_chunk`` event);
- ``first_token`` (``ttft.stage=first_token``), so the retried attempt's first chunk is not the first token;
- ``load_session``, a span that is no stage (the join counts it ``not_stage``).

The context (``ttft.request_id``, the tenant, version, rollout, route, fallback level) is on every span, and
the simulator's request attributes are ``ttft.<name>`` attributes. Timestamps are the story's event time;
a trace is ended (so exported) when the wall clock reaches its end on the demo's pace, like the emitter's
messages.

Usage (by the demo): ``python -m streams.demo.otel_traffic --endpoint 127.0.0.1:4317 --duration 180
--now-ms <plan time> --seed 7 --tenant otel-demo --origin <epoch s>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson

from streams.demo.plan import DEMO_TENANTS, OTEL_TENANT, plan_demo

_MS = 1_000_000  # ns
#: How long an LLM stream runs after its first chunk (the span's end; no stage reads it).
STREAM_TAIL_MS = 300.0
_CONTEXT = {
    "version_id": "ttft.version_id",
    "rollout": "ttft.rollout",
    "route": "ttft.route",
    "fallback_level": "ttft.fallback_level",
}


def otel_requests(
    duration_s: float, now_ms: float, seed: int, tenant: str, tenants: tuple[str, ...]
) -> Iterator[tuple[float, list[dict[str, Any]]]]:
    """``(completed_at_ms, events)`` of each of ``tenant``'s requests in the plan, in completion order.

    A request is complete with its ``first_token`` (the simulator emits it last).
    """
    plan = plan_demo(duration_s, now_ms, seed=seed, tenants=tenants)
    needle = f'"tenant_id":{json.dumps(tenant, ensure_ascii=False)}'.encode()
    pending: dict[bytes, list[dict[str, Any]]] = {}
    for key, value, emit_ts in plan.messages():
        if needle not in value:
            continue
        event = orjson.loads(value)
        if event.get("tenant_id") != tenant:
            continue
        pending.setdefault(key, []).append(event)
        if event["stage"] == "first_token":
            yield emit_ts, pending.pop(key)


def _ns(ms: float) -> int:
    return round(ms * _MS)


def span_specs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One request's stage events as span specs (name, kind, start/end ms, attributes, first chunk, parent).

    ``parent`` is ``"root"``, ``"retrieve"`` or ``None`` (the root itself); the list is in end order, the
    root last, the order a live service exports them in.
    """
    first = events[0]
    context: dict[str, Any] = {"ttft.request_id": first["request_id"], "ttft.tenant_id": first["tenant_id"]}
    for field, attr in _CONTEXT.items():
        if field in first:
            context[attr] = first[field]
    specs: list[dict[str, Any]] = []
    start = end = None
    for event in events:
        stage, ts = event["stage"], float(event["ts_ms"])
        duration = float(event.get("duration_ms") or 0.0)
        attrs = {**context, **{f"ttft.{k}": v for k, v in (event.get("attrs") or {}).items() if k != "trace_id"}}
        spec: dict[str, Any] = {"start": ts, "end": ts + duration, "parent": "root", "attrs": attrs}
        if stage == "request_start":
            start = ts
            # A span no stage maps to (counted as not_stage): the service loading the session first.
            specs.append(
                {
                    "name": "load_session",
                    "kind": "internal",
                    "start": ts,
                    "end": ts + 0.5,
                    "parent": "root",
                    "attrs": context,
                }
            )
            continue
        if stage == "retrieval":
            spec.update(name="retrieve", kind="internal")
            spec["attrs"]["openinference.span.kind"] = "RETRIEVER"
        elif stage == "vector_recall":
            spec.update(name="embed", kind="internal", parent="retrieve")
            spec["attrs"]["openinference.span.kind"] = "EMBEDDING"
        elif stage == "rerank":
            spec.update(name="rerank", kind="internal", parent="retrieve")
            spec["attrs"]["openinference.span.kind"] = "RERANKER"
        elif stage == "llm_ttft":
            spec.update(name="chat", kind="client", first_chunk=ts + duration, end=ts + duration + STREAM_TAIL_MS)
            spec["attrs"].update({"gen_ai.operation.name": "chat", "gen_ai.system": "demo"})
            if "ttft.prompt_tokens" in spec["attrs"]:
                spec["attrs"]["gen_ai.usage.input_tokens"] = spec["attrs"].pop("ttft.prompt_tokens")
            if "ttft.cached_tokens" in spec["attrs"]:
                spec["attrs"]["gen_ai.usage.cache_read_input_tokens"] = spec["attrs"].pop("ttft.cached_tokens")
        else:
            spec.update(name=stage, kind="internal", parent="retrieve" if stage == "bm25_recall" else "root")
            spec["attrs"]["ttft.stage"] = stage
        specs.append(spec)
        end = max(end or spec["end"], spec["end"])
    if start is None or end is None:
        raise ValueError(f"request {first['request_id']} has no request_start or no stage span")
    specs.sort(key=lambda s: s["end"])
    specs.append(
        {"name": "rag.request", "kind": "server", "start": start, "end": end + 1.0, "parent": None, "attrs": context}
    )
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="OTLP/gRPC host:port of the Collector")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--now-ms", type=float, required=True, help="the plan's now_ms")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--tenant", default=OTEL_TENANT)
    parser.add_argument("--tenants", default=",".join(DEMO_TENANTS), help="the plan's tenants, comma-separated")
    parser.add_argument("--origin", type=float, required=True, help="epoch s at which the story starts playing")
    args = parser.parse_args(argv)

    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, set_span_in_context
    except ImportError as exc:
        print(
            f"ttft demo --otel needs the OpenTelemetry SDK and its OTLP/gRPC exporter ({exc}); "
            "`make venv` installs them (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-grpc)",
            file=sys.stderr,
        )
        return 2

    tenants = tuple(args.tenants.split(","))
    plan = plan_demo(args.duration, args.now_ms, seed=args.seed, tenants=tenants)
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-api-otel-demo"}))
    exporter = OTLPSpanExporter(endpoint=f"http://{args.endpoint}", insecure=True, timeout=30)
    provider.add_span_processor(
        BatchSpanProcessor(exporter, max_queue_size=200_000, schedule_delay_millis=200, max_export_batch_size=1024)
    )
    tracer = provider.get_tracer("ttft.demo.otel_traffic")
    kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
    traces = spans = 0
    for done_ms, events in otel_requests(args.duration, args.now_ms, args.seed, args.tenant, tenants):
        delay = args.origin + (done_ms - plan.start_ms) / 1000.0 / plan.speedup - time.time()
        if delay > 0:
            time.sleep(delay)
        specs = span_specs(events)
        root_spec = specs[-1]
        root = tracer.start_span(
            root_spec["name"],
            kind=kinds[root_spec["kind"]],
            start_time=_ns(root_spec["start"]),
            attributes=root_spec["attrs"],
        )
        parents = {"root": set_span_in_context(root)}
        # Start in start order so "retrieve" exists before its children; end in end order, the root last.
        started = []
        for spec in sorted(specs[:-1], key=lambda s: (s["parent"] != "root", s["start"])):
            span = tracer.start_span(
                spec["name"],
                context=parents[spec["parent"]],
                kind=kinds[spec["kind"]],
                start_time=_ns(spec["start"]),
                attributes=spec["attrs"],
            )
            if spec["name"] == "retrieve":
                parents["retrieve"] = set_span_in_context(span)
            if "first_chunk" in spec:
                span.add_event("gen_ai.first_chunk", timestamp=_ns(spec["first_chunk"]))
            started.append((spec["end"], span))
        for end_ms, span in sorted(started, key=lambda pair: pair[0]):
            span.end(end_time=_ns(end_ms))
        root.end(end_time=_ns(root_spec["end"]))
        traces += 1
        spans += len(specs)
    if not provider.force_flush(timeout_millis=60_000):
        print("otel_traffic: the exporter did not flush within 60 s", file=sys.stderr)
        return 1
    provider.shutdown()
    print(f"otel_traffic: {traces} traces, {spans} spans sent to {args.endpoint}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
