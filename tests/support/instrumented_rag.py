"""A small RAG service instrumented with one real OpenAI instrumentation, exporting OTLP to a Collector.

Issue 25's acceptance test runs it once per library, each in its own process of the instrumentation venv
(:mod:`tests.support.instrumentation_venv`; never the project's venv: the libraries patch the same client).
The service is ``tests/data/otel_instrumentations/capture.py``'s (:class:`RagService` against its loopback
stub, which streams the first chunk :data:`FIRST_CHUNK_DELAY_S` after the request), unmodified: no ``ttft.*``
attribute anywhere, the tenant as the resource attribute ``tenant.id``. Spans go to the Collector with the
SDK's own ``BatchSpanProcessor`` and OTLP/HTTP exporter, as a deployed service's would; a copy stays in an
in-memory exporter so the service can write what its own spans say.

``--first-chunk-helper``: the service also makes the one change ttft-emit documents for an instrumentation
that records no first chunk (:func:`ttft_emit.otel.time_first_chunk` on its client; the emitter's source is
put on the path, as ``pip install ttft-emit`` would install it).

``--out`` (JSON): the library's versions, the helper's counters when it ran, and per request what the client
saw (``capture.py``'s truth) and the trace's spans as exported (name, ids, start and end ns, attributes,
events, scope). Nothing here knows the mapping.

Usage (the venv's python): ``python tests/support/instrumented_rag.py --library openinference
--endpoint http://127.0.0.1:4318 --tenant rag-openinference --requests 40 --out truth.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "otel_instrumentations"))

from capture import LIBRARIES, RagService, instrument, serve, versions

REPO = Path(__file__).resolve().parents[2]
#: Every ``CASE_CYCLE``-th request, from these offsets: a non-streaming call and a retried retrieval.
CASE_CYCLE = 8
NON_STREAM_AT = 3
RETRIED_AT = 6


def case_of(i: int) -> str:
    """The case of the ``i``-th request: mostly streaming, some not, some with a retried retrieval."""
    at = i % CASE_CYCLE
    return "non_stream" if at == NON_STREAM_AT else "retried" if at == RETRIED_AT else "stream"


def span_doc(span: Any) -> dict[str, Any]:
    """One finished SDK span as plain JSON (ids in hex, times in ns)."""
    parent = span.parent.span_id if span.parent is not None else 0
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "span_id": format(span.context.span_id, "016x"),
        "parent": format(parent, "016x") if parent else "",
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": {k: v if isinstance(v, str | int | float | bool) else str(v) for k, v in span.attributes.items()},
        "resource": {k: str(v) for k, v in span.resource.attributes.items()},
        "events": [[e.name, e.timestamp] for e in span.events],
        "scope": [scope.name if scope else "", (scope.version or "") if scope else ""],
    }


def export_processors(endpoint: str) -> tuple[Any, list[Any]]:
    """The in-memory exporter that keeps a copy of the spans, and the span processors to add to the provider:
    that copy, and the SDK's ``BatchSpanProcessor`` with its OTLP/HTTP exporter to the Collector at ``endpoint``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    kept = InMemorySpanExporter()
    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=30)
    batch = BatchSpanProcessor(exporter, schedule_delay_millis=100, max_export_batch_size=256)
    return kept, [SimpleSpanProcessor(kept), batch]


def attach_spans(provider: Any, kept: Any, truth: list[dict[str, Any]], who: str) -> None:
    """Flush every span to the Collector (or exit saying so), then give each request of ``truth`` its trace's
    spans as exported (``spans``, :func:`span_doc`)."""
    if not provider.force_flush(timeout_millis=30_000):
        raise SystemExit(f"{who}: the exporter did not flush within 30 s")
    provider.shutdown()
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for span in kept.get_finished_spans():
        by_trace.setdefault(format(span.context.trace_id, "032x"), []).append(span_doc(span))
    for request in truth:
        request["spans"] = by_trace.get(request["trace_id"], [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), required=True)
    parser.add_argument("--endpoint", required=True, help="OTLP/HTTP base URL of the Collector")
    parser.add_argument("--tenant", required=True, help="the resource attribute tenant.id")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--first-chunk-helper", action="store_true", help="time_first_chunk(client) (ttft-emit)")
    args = parser.parse_args()

    kept, processors = export_processors(args.endpoint)
    resource = {"service.name": f"rag-{args.library}", "service.version": "1.4.2", "tenant.id": args.tenant}
    provider = instrument(args.library, resource, processors)
    server, base_url = serve()
    service = RagService(args.library, provider, base_url)
    helper = None
    if args.first_chunk_helper:
        sys.path.insert(0, str(REPO / "emitter" / "src"))
        from ttft_emit.otel import time_first_chunk

        helper = time_first_chunk(service.client, tracer_provider=provider)
    truth = [service.ask(case_of(i)) for i in range(args.requests)]
    server.shutdown()
    attach_spans(provider, kept, truth, f"instrumented_rag ({args.library})")
    doc = {"library": args.library, "tenant": args.tenant, "versions": versions(args.library), "requests": truth}
    if helper is not None:
        doc["first_chunk_helper"] = dataclasses.asdict(helper.stats)
    args.out.write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
