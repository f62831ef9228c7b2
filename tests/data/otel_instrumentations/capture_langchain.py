"""Capture the spans of a LangChain RAG chain traced by OpenInference's, then OpenLLMetry's, LangChain and OpenAI
instrumentors.

Phoenix's and OpenInference's guides set up both instrumentors for a LangChain app: ``LangChainInstrumentor``
traces the chain (``RETRIEVER``, ``PROMPT``, ``LLM`` spans from LangChain's callbacks) and
``OpenAIInstrumentor`` the model client. Each call of ``ChatOpenAI`` then gives two ``LLM`` spans: LangChain's
(no first-chunk event) and, inside it by time, the client's ``ChatCompletion`` (event ``First Token Stream
Event``). The two are not linked: the client's span has the span that was current in OpenTelemetry's
context (the root) as its parent. The retriever is LangChain's ``EnsembleRetriever`` (BM25 and a vector
store, hybrid search), a ``RETRIEVER`` span around the two ``RETRIEVER`` spans of its parts. Cases, one trace
each, under a root span ``POST /ask``, against the stub of ``capture.py`` (first chunk 120 ms after the
request):

1. ``stream``: both instrumentors, ``ChatOpenAI(streaming=True)``;
2. ``non_stream``: both instrumentors, without streaming;
3. ``langchain_only``: the LangChain instrumentor alone (the OpenAI one uninstrumented), streaming.

OpenLLMetry's (``--library openllmetry``, ``langchain_openllmetry.*``): its LangChain instrumentor starts a
``ChatOpenAI.chat`` span (``gen_ai.operation.name = chat``, no first chunk, no stream flag) from a callback,
without making it current, and suppresses its OpenAI instrumentor's span under it; its retrievers are
``gen_ai.operation.name = vector_db_retrieve``. Cases: ``stream`` and ``non_stream`` with ttft-emit's helper on
the model's client (``time_first_chunk(llm.root_client)``), and ``no_helper`` (streaming, without it).

Outputs ``<name>.otlp`` and ``<name>.json`` as ``capture.py`` writes its own (the truth per trace: the
client's wall time before the call and at its first chunk). Run it in a venv of its own::

    python3.11 -m venv /tmp/lc
    /tmp/lc/bin/pip install -r tests/data/otel_instrumentations/requirements-langchain.txt ./emitter
    /tmp/lc/bin/python tests/data/otel_instrumentations/capture_langchain.py
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub and its constants

#: Library -> (its LangChain instrumentor, its OpenAI instrumentor, their distributions, the output's name).
LIBRARIES: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "openinference": (
        "openinference.instrumentation.langchain:LangChainInstrumentor",
        "openinference.instrumentation.openai:OpenAIInstrumentor",
        ("openinference-instrumentation-langchain", "openinference-instrumentation-openai"),
        "langchain",
    ),
    "openllmetry": (
        "opentelemetry.instrumentation.langchain:LangchainInstrumentor",
        "opentelemetry.instrumentation.openai:OpenAIInstrumentor",
        ("opentelemetry-instrumentation-langchain", "opentelemetry-instrumentation-openai", "ttft-emit"),
        "langchain_openllmetry",
    ),
}
#: Each library's cases: (name, streaming, the OpenAI instrumentor on, ttft-emit's helper on the client).
CASES: dict[str, tuple[tuple[str, bool, bool, bool], ...]] = {
    "openinference": (
        ("stream", True, True, False),
        ("non_stream", False, True, False),
        ("langchain_only", True, False, False),
    ),
    "openllmetry": (
        ("stream", True, True, True),
        ("non_stream", False, True, True),
        ("no_helper", True, True, False),
    ),
}
DISTRIBUTIONS = (
    "langchain-core",
    "langchain-openai",
    "langchain-classic",
    "langchain-community",
    "openai",
    "opentelemetry-sdk",
)
DOCS = (
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Seine flows through Paris.",
)


def _load(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def instrument(library: str, provider: Any) -> Any:
    """The library's LangChain and OpenAI instrumentors on ``provider``; returns the OpenAI one."""
    langchain_path, openai_path, _, _ = LIBRARIES[library]
    _load(langchain_path)().instrument(tracer_provider=provider)
    openai_instrumentor = _load(openai_path)()
    openai_instrumentor.instrument(tracer_provider=provider)
    return openai_instrumentor


class LangChainRag:
    """The service: an LCEL chain (``EnsembleRetriever`` of BM25 and a vector store, a prompt, ``ChatOpenAI``)
    against the stub at ``base_url``; :meth:`ask` is one request, a trace under a root span ``POST /ask``."""

    def __init__(self, provider: Any, base_url: str) -> None:
        from langchain_classic.retrievers import EnsembleRetriever
        from langchain_community.retrievers import BM25Retriever
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_core.vectorstores import InMemoryVectorStore
        from langchain_openai import OpenAIEmbeddings

        self.provider, self.base_url = provider, base_url
        embeddings = OpenAIEmbeddings(
            base_url=base_url, api_key="stub-key", model=capture.EMBEDDING_MODEL, check_embedding_ctx_length=False
        )
        store = InMemoryVectorStore(embeddings)
        store.add_texts(list(DOCS))
        self.retriever = EnsembleRetriever(
            retrievers=[BM25Retriever.from_texts(list(DOCS), k=1), store.as_retriever(search_kwargs={"k": 1})],
            weights=[0.5, 0.5],
        )
        self.prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {question}")
        self.tracer = provider.get_tracer("rag-langchain")
        self.chains: dict[tuple[bool, bool], Any] = {}

    def chain(self, streaming: bool, helper: bool) -> Any:
        """The chain with a ``ChatOpenAI`` that streams or not, its client timed by ttft-emit's helper or not."""
        if (streaming, helper) not in self.chains:
            from langchain_core.output_parsers import StrOutputParser
            from langchain_core.runnables import RunnablePassthrough
            from langchain_openai import ChatOpenAI

            llm = ChatOpenAI(
                base_url=self.base_url, api_key="stub-key", model=capture.MODEL, streaming=streaming, max_retries=0
            )
            if helper:  # the service's one line (docs/otlp-mapping.md, "The helper")
                from ttft_emit.otel import time_first_chunk

                time_first_chunk(llm.root_client, tracer_provider=self.provider)
            parts = {"context": self.retriever, "question": RunnablePassthrough()}
            self.chains[streaming, helper] = parts | self.prompt | llm | StrOutputParser()
        return self.chains[streaming, helper]

    def ask(self, case: str, streaming: bool, helper: bool) -> dict[str, Any]:
        """One request; what the client saw."""
        chain = self.chain(streaming, helper)
        with self.tracer.start_as_current_span("POST /ask") as root:
            called_ns, first_chunk_ns = time.time_ns(), None
            for _ in chain.stream(capture.RagService.question):
                if first_chunk_ns is None:
                    first_chunk_ns = time.time_ns()
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": streaming,
            "called_ns": called_ns,
            "first_chunk_ns": first_chunk_ns if streaming else None,
            "answered_ns": time.time_ns(),
        }


def versions(library: str) -> dict[str, str]:
    return {d: metadata.version(d) for d in (*DISTRIBUTIONS, *LIBRARIES[library][2])}


def run(library: str, out: Path) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-langchain", "service.version": "2.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    openai_instrumentor = instrument(library, provider)
    server, base_url = capture.serve()
    service = LangChainRag(provider, base_url)
    exporter.clear()  # the documents' embeddings belong to no request
    truth: list[dict[str, Any]] = []
    for case, streaming, with_openai, with_helper in CASES[library]:
        if not with_openai:
            openai_instrumentor.uninstrument()
        truth.append(service.ask(case, streaming, with_helper))
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = LIBRARIES[library][3]
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc = {"library": f"langchain/{library}", "versions": versions(library), "tenant": capture.TENANT, "traces": truth}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--library", choices=sorted(LIBRARIES), help="run one library (this process)")
    args = parser.parse_args()
    if args.library:
        run(args.library, args.out)
        return
    for library in LIBRARIES:  # one process each: the instrumentors patch the same classes
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)]
        subprocess.run(cmd, check=True, timeout=180)


if __name__ == "__main__":
    main()
