"""Capture the spans of a LangChain RAG chain traced by OpenInference's LangChain and OpenAI instrumentors.

Phoenix's and OpenInference's guides set up both instrumentors for a LangChain app: ``LangChainInstrumentor``
traces the chain (``RETRIEVER``, ``PROMPT``, ``LLM`` spans from LangChain's callbacks) and
``OpenAIInstrumentor`` the model client. Each call of ``ChatOpenAI`` then gives two ``LLM`` spans: LangChain's
(no first-chunk event) and, inside it by time, the client's ``ChatCompletion`` (event ``First Token Stream
Event``). The two are not linked: the client's span has the span that was current in OpenTelemetry's
context (the root) as its parent. The retriever is LangChain's ``EnsembleRetriever`` (BM25 and a vector
store, hybrid search), a ``RETRIEVER`` span around the two ``RETRIEVER`` spans of its parts.

The chain runs unmodified against the stub of ``capture.py`` (first chunk 120 ms after the request), one
trace per case, under a root span ``POST /ask``:

1. ``stream``: both instrumentors, ``ChatOpenAI(streaming=True)``;
2. ``non_stream``: both instrumentors, without streaming;
3. ``langchain_only``: the LangChain instrumentor alone (the OpenAI one uninstrumented), streaming.

Outputs ``langchain.otlp`` and ``langchain.json`` as ``capture.py`` writes its own (the truth per trace: the
client's wall time before the call and at its first chunk). Run it in a venv of its own::

    python3.11 -m venv /tmp/lc
    /tmp/lc/bin/pip install -r tests/data/otel_instrumentations/requirements-langchain.txt
    /tmp/lc/bin/python tests/data/otel_instrumentations/capture_langchain.py
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub and its constants

DISTRIBUTIONS = (
    "langchain-core",
    "langchain-openai",
    "langchain-classic",
    "langchain-community",
    "openinference-instrumentation-langchain",
    "openinference-instrumentation-openai",
    "openai",
    "opentelemetry-sdk",
)
DOCS = (
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Seine flows through Paris.",
)


def run(out: Path) -> None:
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-langchain", "service.version": "2.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    openai_instrumentor = OpenAIInstrumentor()
    openai_instrumentor.instrument(tracer_provider=provider)
    server, base_url = capture.serve()

    embeddings = OpenAIEmbeddings(
        base_url=base_url, api_key="stub-key", model=capture.EMBEDDING_MODEL, check_embedding_ctx_length=False
    )
    store = InMemoryVectorStore(embeddings)
    store.add_texts(list(DOCS))
    retriever = EnsembleRetriever(
        retrievers=[BM25Retriever.from_texts(list(DOCS), k=1), store.as_retriever(search_kwargs={"k": 1})],
        weights=[0.5, 0.5],
    )
    prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {question}")
    tracer = provider.get_tracer("rag-langchain")
    truth: list[dict[str, Any]] = []
    for case in ("stream", "non_stream", "langchain_only"):
        if case == "langchain_only":
            openai_instrumentor.uninstrument()
        streaming = case != "non_stream"
        llm = ChatOpenAI(base_url=base_url, api_key="stub-key", model=capture.MODEL, streaming=streaming, max_retries=0)
        chain = {"context": retriever, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
        with tracer.start_as_current_span("POST /ask") as root:
            called_ns, first_chunk_ns = time.time_ns(), None
            for _ in chain.stream(capture.RagService.question):
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
    with (out / "langchain.otlp").open("wb") as f:
        for trace in truth:
            mine = [s for s in spans if format(s.context.trace_id, "032x") == trace["trace_id"]]
            raw = encode_spans(mine).SerializeToString()
            f.write(struct.pack(">I", len(raw)) + raw)
    versions = {name: metadata.version(name) for name in DISTRIBUTIONS}
    doc = {"library": "langchain", "versions": versions, "tenant": capture.TENANT, "traces": truth}
    (out / "langchain.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    run(parser.parse_args().out)


if __name__ == "__main__":
    main()
