"""Capture the spans of a LlamaIndex RAG query traced by OpenInference's LlamaIndex and OpenAI instrumentors.

OpenInference's guides set up both instrumentors for a LlamaIndex app. A ``VectorStoreIndex`` over three small
documents (``OpenAIEmbedding`` and llama-index's ``OpenAI`` LLM both pointed at the loopback stub of
``capture.py``), a query engine, under a root span ``POST /ask``; one trace per case:

1. ``stream``: both instrumentors, ``as_query_engine(streaming=True)``;
2. ``non_stream``: both instrumentors, without streaming;
3. ``llamaindex_only``: the LlamaIndex instrumentor alone (the OpenAI one uninstrumented), streaming.

Notes on the stub: its ``/embeddings`` answers one vector per request whatever the input, so the embedding
model is built with ``embed_batch_size=1`` (one request per document). Tokenizers: llama-index-core ships the
tiktoken files it needs (gpt2, cl100k_base) in ``_static/tiktoken_cache``; nothing is downloaded.

Outputs ``llamaindex.otlp`` (4-byte big-endian length + serialized ExportTraceServiceRequest per trace) and
``llamaindex.json`` (the truth per trace), in ``--out`` (default: this file's folder). What the spans say (and
why the mapping needed two changes for them) is in docs/otlp-mapping.md: LlamaIndex's streaming LLM span ends
when the stream is handed back, before its first chunk, whose event it adds afterwards; ``OpenAI.stream`` holds
``OpenAI.stream_chat`` by its parent link, and the client's ``ChatCompletion`` is a sibling that starts after
both ended. Run it in a venv of its own::

    python3.11 -m venv /tmp/li
    /tmp/li/bin/pip install -r tests/data/otel_instrumentations/requirements-llamaindex.txt
    /tmp/li/bin/python tests/data/otel_instrumentations/capture_llamaindex.py [--table]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub and its constants

DISTRIBUTIONS = (
    "llama-index-core",
    "llama-index-llms-openai",
    "llama-index-embeddings-openai",
    "openinference-instrumentation-llama-index",
    "openinference-instrumentation-openai",
    "openai",
    "opentelemetry-sdk",
)
DOCS = (
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Seine flows through Paris.",
)


def run(out: Path) -> list[Any]:
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.embeddings.openai import OpenAIEmbedding
    from llama_index.llms.openai import OpenAI
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-llamaindex", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    openai_instrumentor = OpenAIInstrumentor()
    openai_instrumentor.instrument(tracer_provider=provider)
    server, base_url = capture.serve()

    embed_model = OpenAIEmbedding(
        model=capture.EMBEDDING_MODEL, api_base=base_url, api_key="stub-key", embed_batch_size=1, max_retries=0
    )
    llm = OpenAI(model=capture.MODEL, api_base=base_url, api_key="stub-key", max_retries=0)
    Settings.embed_model, Settings.llm = embed_model, llm
    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS], embed_model=embed_model)
    exporter.clear()  # the indexing spans (embeddings of the documents) are not part of any request
    tracer = provider.get_tracer("rag-llamaindex")
    truth: list[dict[str, Any]] = []
    for case in ("stream", "non_stream", "llamaindex_only"):
        if case == "llamaindex_only":
            openai_instrumentor.uninstrument()
        streaming = case != "non_stream"
        engine = index.as_query_engine(llm=llm, streaming=streaming, similarity_top_k=2)
        with tracer.start_as_current_span("POST /ask") as root:
            called_ns, first_chunk_ns = time.time_ns(), None
            response = engine.query(capture.RagService.question)
            if streaming:
                for _ in response.response_gen:
                    if first_chunk_ns is None:
                        first_chunk_ns = time.time_ns()
        truth.append(
            {
                "case": case,
                "trace_id": format(root.get_span_context().trace_id, "032x"),
                "streaming": streaming,
                "called_ns": called_ns,
                "first_chunk_ns": first_chunk_ns if streaming else None,
                "answered_ns": time.time_ns(),
            }
        )
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    capture.write_traces(out / "llamaindex.otlp", spans, truth)
    stray = [s.name for s in spans if format(s.context.trace_id, "032x") not in {t["trace_id"] for t in truth}]
    versions = {name: metadata.version(name) for name in DISTRIBUTIONS}
    doc = {"library": "llamaindex", "versions": versions, "tenant": capture.TENANT, "traces": truth}
    if stray:
        doc["spans_outside_the_traces"] = stray
    (out / "llamaindex.json").write_text(json.dumps(doc, indent=1) + "\n")
    return spans


def table(spans: list[Any], truth: list[dict[str, Any]]) -> None:
    for trace in truth:
        mine = sorted(
            (s for s in spans if format(s.context.trace_id, "032x") == trace["trace_id"]), key=lambda s: s.start_time
        )
        root = next(s for s in mine if s.parent is None)
        t0 = root.start_time
        print(f"\n== {trace['case']}  trace {trace['trace_id']}")
        if trace["first_chunk_ns"]:
            called, first = (trace["called_ns"] - t0) / 1e6, (trace["first_chunk_ns"] - t0) / 1e6
            print(f"   truth: called +{called:.1f} ms, first chunk +{first:.1f} ms")
        print(f"   {'name':44} {'kind':10} {'span':16} {'parent':16} {'start':>8} {'end':>8}  events")
        for s in mine:
            kind = (s.attributes or {}).get("openinference.span.kind", "")
            parent = format(s.parent.span_id, "016x") if s.parent else "-"
            events = ",".join(e.name for e in s.events)
            print(
                f"   {s.name[:44]:44} {kind:10} {format(s.context.span_id, '016x')} {parent:16} "
                f"{(s.start_time - t0) / 1e6:8.1f} {(s.end_time - t0) / 1e6:8.1f}  {events}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--table", action="store_true", help="print the spans of each trace")
    args = parser.parse_args()
    spans = run(args.out)
    if args.table:
        table(spans, json.loads((args.out / "llamaindex.json").read_text())["traces"])


if __name__ == "__main__":
    main()
