"""A RAG service instrumented with the OpenTelemetry SDK for issue 15's acceptance test (its own process).

Each request is a :class:`tests.support.otlp_traffic.TraceSpec` (OpenInference or GenAI shape, retried
retrieval, missing LLM span, an LLM span streaming 0.5–5 s after its first chunk). The service starts and
ends the spans through ``opentelemetry-sdk`` with the timestamps it chose (``start_time=`` / ``end_time=``,
no real sleeping), its span and trace ids come from an id generator it drives, and they are exported with
the OTLP/gRPC exporter to the Collector. Some requests are unmappable on purpose: no tenant anywhere
(``missing_tenant`` for each stage span), or an LLM span without a first chunk (forwarded ``llm_unmeasured``:
its request is ``no_first_chunk``).

Spans end in end-time order, ``--window-s`` of event time at a time (so most traces reach the Collector in
several exports, as live ones do). Every ``--split-every``-th trace is certainly exported in two parts: its
early children first, a flush and a pause longer than the Collector's batch timeout, then its LLM and root.
End-time order matters: a span exported seconds of event time before another that ended earlier would move
the bridge's watermark (the latest span end) past a held trace's due time, resolving it before its root came
(its request id then falls back to the trace id), which no live SDK does. So each window is flushed twice
(its first spans, then the split traces' LLM and root spans) before the next window's spans end: with one
tracer provider per resource, each exporting on its own timer too, the next window's spans of one provider
could otherwise reach the Collector before this window's root spans of another. Traces with ``tenant.id`` on their
resource and without go through one tracer provider per resource (three in all).

As it runs, the service writes its ground truth to ``--out`` (JSON): per trace the timings it passed to the
SDK, the ``requests`` row they imply, the stage events the emitter would send for the same request and the
spans that must be dead-lettered, with their reasons. Nothing here calls the mapping code.

Usage: ``python -m tests.support.otel_acceptance_service --endpoint 127.0.0.1:4317 --traces 2000 --out t.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Span, set_span_in_context

from tests.support.otlp_traffic import TraceSpec, build_trace, emitter_events, resource_attrs, truth_row

TENANTS = ("acme", "globex")
#: Span names of the trace that are stages (the rest, ``GET /profile`` and ``tool``, are not).
STAGE_SPANS = frozenset({"POST /ask", "retrieve", "embed", "rerank", "assemble", "llm"})
US = 1_000  # ns per microsecond


class ChosenIds(IdGenerator):
    """The ids the service picked for the next span (so its ground truth names the spans it exported)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id


def _specs(n: int, rng: random.Random, missing_tenant_every: int, no_chunk_every: int) -> list[tuple[TraceSpec, str]]:
    """The requests and what is wrong with each: ``""``, ``missing_tenant`` or ``no_first_chunk``."""
    start = int(time.time() * 1e6) - 900_000_000
    out: list[tuple[TraceSpec, str]] = []
    for i in range(n):
        spec = build_trace(
            rng, i + 1, start + i * 10_000, shape=("openinference", "gen_ai")[i % 2], tenant=TENANTS[i % 2]
        )
        fault = ""
        if i % missing_tenant_every == 3:
            fault = "missing_tenant"
            spec.tenant_on_resource = False
            for span in spec.spans:
                span.attributes.pop("ttft.tenant_id", None)
        elif i % no_chunk_every == 7 and spec.llm is not None:
            fault = "no_first_chunk"
            llm = next(s for s in spec.spans if s.name == "llm")
            llm.events.clear()
            llm.attributes.pop("gen_ai.response.time_to_first_chunk", None)
            spec.llm = None  # the request as the store must see it: no first token, the call unmeasured
            spec.unmeasured = (llm.start_us, llm.end_us)
        out.append((spec, fault))
    return out


def _truth(spec: TraceSpec, fault: str, split: bool) -> dict[str, Any]:
    if fault == "missing_tenant":
        dead = [["missing_tenant", s.span_id.hex()] for s in spec.spans if s.name in STAGE_SPANS]
    else:
        dead = []
    return {
        "trace_id": spec.trace_id.hex(),
        "tenant": spec.tenant,
        "request_id": spec.rid,
        "shape": spec.shape,
        "fault": fault,
        "split": split,
        "spans": [s.span_id.hex() for s in spec.spans],
        "not_stage_spans": sum(s.name not in STAGE_SPANS for s in spec.spans),
        "timings_us": {
            "start": spec.start_us,
            "retrievals": spec.retrievals,
            "rerank": spec.rerank,
            "prompt": spec.prompt,
            "llm": spec.llm,
            "spans": [[s.name, s.span_id.hex(), s.start_us, s.end_us, s.events] for s in spec.spans],
        },
        "row": None if fault == "missing_tenant" else truth_row(spec),
        "events": [] if fault == "missing_tenant" else [[k.decode(), v.decode()] for k, v in emitter_events(spec)],
        "dead": dead,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True, help="OTLP/gRPC host:port of the Collector")
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--split-every", type=int, default=3)
    parser.add_argument("--missing-tenant-every", type=int, default=100)
    parser.add_argument("--no-chunk-every", type=int, default=50)
    parser.add_argument("--window-s", type=float, default=1.0, help="event time whose spans end together")
    parser.add_argument("--pause-s", type=float, default=0.3, help="between a split trace's two exports")
    parser.add_argument("--seed", type=int, default=1515)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    ids = ChosenIds()
    providers: dict[tuple[tuple[str, Any], ...], TracerProvider] = {}

    def tracer_for(spec: TraceSpec) -> Any:
        key = tuple(sorted(resource_attrs(spec).items()))
        if key not in providers:
            provider = TracerProvider(resource=Resource.create(dict(key)), id_generator=ids)
            exporter = OTLPSpanExporter(endpoint=f"http://{args.endpoint}", insecure=True, timeout=30)
            processor = BatchSpanProcessor(
                exporter, max_queue_size=200_000, schedule_delay_millis=100, max_export_batch_size=512
            )
            provider.add_span_processor(processor)
            providers[key] = provider
        return providers[key].get_tracer("ttft.tests.otel_acceptance_service")

    def flush() -> None:
        for provider in providers.values():
            if not provider.force_flush(timeout_millis=30_000):
                raise SystemExit("otel_acceptance_service: the exporter did not flush within 30 s")

    rng = random.Random(args.seed)
    specs = _specs(args.traces, rng, args.missing_tenant_every, args.no_chunk_every)
    truth: list[dict[str, Any]] = []
    # (end in µs, is root, order, span, after the flush) for every span; all are started now, ended below.
    ends: list[tuple[int, bool, int, Span, bool]] = []
    for k, (spec, fault) in enumerate(specs):
        split = bool(args.split_every) and k % args.split_every == 0
        truth.append(_truth(spec, fault, split))
        tracer = tracer_for(spec)
        ids.trace_id = int.from_bytes(spec.trace_id, "big")
        started: dict[bytes, Span] = {}
        for s in spec.spans:  # parents come before their children
            ids.span_id = int.from_bytes(s.span_id, "big")
            ctx = set_span_in_context(started[s.parent]) if s.parent else Context()
            span = tracer.start_span(s.name, context=ctx, attributes=s.attributes, start_time=s.start_us * US)
            for name, at_us in s.events:
                span.add_event(name, timestamp=at_us * US)
            started[s.span_id] = span
            ends.append((s.end_us, s.parent == b"", len(ends), span, split and s.name in ("llm", "POST /ask")))
    ends.sort(key=lambda e: e[:3])
    # Spans end (and are exported) in end-time order, a window of event time at a time, as a live service's
    # would. In each window the split traces' LLM and root spans end only after the others were flushed and
    # the Collector's 200 ms batch timeout passed, so they reach Kafka in another message than their children.
    window_us = int(args.window_s * 1e6)
    at = 0
    while at < len(ends):
        stop = at
        while stop < len(ends) and ends[stop][0] < ends[at][0] + window_us:
            stop += 1
        window = ends[at:stop]
        for end_us, _, _, span, late in window:
            if not late:
                span.end(end_time=end_us * US)
        flush()
        time.sleep(args.pause_s)
        for end_us, _, _, span, late in window:
            if late:
                span.end(end_time=end_us * US)
        # Exported before the next window's spans end: else one provider's background export could send
        # the next window's spans ahead of another provider's LLM and root spans of this one.
        flush()
        at = stop
    flush()
    for provider in providers.values():
        provider.shutdown()
    args.out.write_text(json.dumps({"traces": truth}))


if __name__ == "__main__":
    main()
