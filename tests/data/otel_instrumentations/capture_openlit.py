"""Capture the spans OpenLIT (``openlit.init``) exports for OpenAI calls against the loopback stub of capture.py
(first chunk 120 ms after the request); write openlit.otlp (4-byte big-endian length + one
ExportTraceServiceRequest per trace) and openlit.json (what the client saw) beside this file, then print a span
table. Three requests under a root ``POST /ask``, each after a retrieval span with an embeddings call:
streaming, not streaming, streaming.

On a streaming call OpenLIT's ``gen_ai.server.time_to_first_token`` counts from when ``create()`` returned (the
response headers), not from its span's start (docs/otlp-mapping.md).

openlit 1.45's ``init`` takes no tracer: it reuses the global SDK TracerProvider if one is set, so ours is
set globally first. Metrics and events are disabled, and pricing comes from a local empty file (otherwise
``init`` fetches its pricing file from the network). Everything else is openlit's default
(including its httpx/requests/urllib3 instrumentors).

    python3.11 -m venv /tmp/olit
    /tmp/olit/bin/pip install -r tests/data/otel_instrumentations/requirements-openlit.txt
    /tmp/olit/bin/python tests/data/otel_instrumentations/capture_openlit.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub

OUT = Path(__file__).resolve().parent
CASES = ("stream", "non_stream", "stream2")
KEYS = ("first", "token", "stream", "operation", "time")


def main() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-openlit", "tenant.id": "acme"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    import openlit

    pricing = Path(tempfile.mkdtemp(prefix="openlit-")) / "pricing.json"
    pricing.write_text("{}")
    openlit.init(
        service_name="rag-openlit",
        disable_metrics=True,
        disable_events=True,
        pricing_json=str(pricing),
    )

    import openai

    server, base_url = capture.serve()
    client = openai.OpenAI(base_url=base_url, api_key="stub-key", max_retries=0)
    tracer = provider.get_tracer("rag-api")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    truth = []
    for case in CASES:
        streaming = case != "non_stream"
        with tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            started_ns = time.time_ns()
            with tracer.start_as_current_span(
                "retrieve", kind=SpanKind.CLIENT, attributes={"gen_ai.operation.name": "retrieval"}
            ):
                client.embeddings.create(model=capture.EMBEDDING_MODEL, input=messages[0]["content"])
                time.sleep(0.020)  # the vector search
            time.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            first_chunk_ns = None
            if streaming:
                stream = client.chat.completions.create(
                    model=capture.MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
                )
                for _ in stream:
                    if first_chunk_ns is None:
                        first_chunk_ns = time.time_ns()
            else:
                client.chat.completions.create(model=capture.MODEL, messages=messages)
            answered_ns = time.time_ns()
        truth.append(
            {
                "case": case,
                "trace_id": format(root.get_span_context().trace_id, "032x"),
                "streaming": streaming,
                "started_ns": started_ns,
                "called_ns": called_ns,
                "first_chunk_ns": first_chunk_ns,
                "answered_ns": answered_ns,
            }
        )
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    capture.write_traces(OUT / "openlit.otlp", spans, truth)
    dists = (
        "openlit",
        "openai",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-common",
        "opentelemetry-instrumentation-httpx",
    )
    doc = {"library": "openlit", "versions": {d: metadata.version(d) for d in dists}, "tenant": "acme", "traces": truth}
    (OUT / "openlit.json").write_text(json.dumps(doc, indent=1) + "\n")
    capture.print_spans(spans, truth, KEYS)


if __name__ == "__main__":
    main()
