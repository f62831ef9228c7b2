"""Capture the spans of LlamaIndex and Haystack RAG pipelines traced by OpenLLMetry's (traceloop's) framework
instrumentations, ``opentelemetry-instrumentation-llamaindex`` and ``opentelemetry-instrumentation-haystack``, each
with OpenLLMetry's ``opentelemetry-instrumentation-openai`` (the set-up traceloop's guides give: the framework
instrumentor and the provider's), against the loopback stub of ``capture.py``; write
``<set-up>.otlp`` (capture.py's ``write_traces``) and ``<set-up>.json`` (what the caller
saw), then print a span table (capture.py's ``print_spans``).

The pipelines are those of the OpenInference captures:

- LlamaIndex (capture_llamaindex.py's): a ``VectorStoreIndex`` over its three documents (``OpenAIEmbedding`` with
  ``embed_batch_size=1`` and llama-index's ``OpenAI`` LLM, both pointed at the stub), built before the requests (its
  spans cleared), ``index.as_query_engine(llm=llm, streaming=..., similarity_top_k=2).query(question)``; the
  caller's first token is the first item of ``response.response_gen``;
- Haystack (capture_haystack.py's ``build`` and ``HaystackRag``, imported): ``InMemoryBM25Retriever`` ->
  ``ChatPromptBuilder`` -> ``OpenAIChatGenerator``; a stream passes ``streaming_callback`` in the run's data, the
  caller's first token is the first callback with content.

Each request runs under a root span ``POST /ask`` (SERVER). Cases, one trace each, in this order (none before them,
so ``stream`` is a cold first request):

1. ``stream``: streaming;
2. ``non_stream``: the same without streaming (the stub answers after ``NON_STREAM_DELAY_S``);
3. ``stream_warm``: streaming again.

Set-ups, each in its own process (the instrumentors patch the same classes):

- ``llamaindex_openllmetry``: ``LlamaIndexInstrumentor`` and ``OpenAIInstrumentor`` (OpenLLMetry's);
- ``llamaindex_openllmetry_helper``: both, and ttft-emit's helper on the LLM's (reused) client,
  ``time_first_chunk(llm._get_client())``;
- ``haystack_openllmetry``: ``HaystackInstrumentor`` and ``OpenAIInstrumentor`` (OpenLLMetry's), on Haystack 3
  (requirements-haystack.txt's 3.4.1). OpenLLMetry's Haystack instrumentor (0.62.4) wraps
  ``haystack.components.generators.openai.OpenAIGenerator.run`` first, a module Haystack 3 removed: its
  ``instrument()`` raises ``TargetModuleNotFoundError`` and wraps nothing. traceloop's SDK (``Traceloop.init``)
  catches and logs that and goes on, so a Haystack 3 service gets the OpenAI instrumentor's spans alone; this
  set-up does the same and keeps the error in the json (``haystack_instrumentor_error``);
- ``haystack_openllmetry_helper``: the same, and the helper on the generator's client (``time_first_chunk(
  generator.client)`` after ``generator.warm_up()``);
- ``haystack2_openllmetry``, ``haystack2_openllmetry_helper``: the same two on Haystack 2 (``haystack-ai``
  2.31.0, the last 2.x, in a venv of its own), where the Haystack instrumentor works: a span
  ``haystack_pipeline.workflow`` around ``Pipeline.run`` and ``haystack_openai.chat`` around
  ``OpenAIChatGenerator.run`` (nothing for the retriever or the prompt builder).

The helper comes from this repository's ``emitter/src`` (put on ``sys.path``); the json of a helper set-up has its
``stats`` after the first (cold) request, as ``helper_stats_warm_up``, and at the end. Haystack's telemetry is off
(capture_haystack.py sets ``HAYSTACK_TELEMETRY_ENABLED=False`` before Haystack is imported); OpenLLMetry's
instrumentations send nothing themselves (traceloop's SDK, which would, is not installed): nothing leaves loopback.
Content tracing is OpenLLMetry's default (``TRACELOOP_TRACE_CONTENT`` unset: prompts and completions on the spans).

LlamaIndex and Haystack 3 fit one venv: llama-index-llms-openai 0.8.3 wants ``openai<3``, so ``openai`` is 2.x
there (the captures of capture_haystack.py ran with 3.x). Haystack 2 needs a venv of its own: its pins are the
lines ``#h2`` of requirements-openllmetry-frameworks.txt. Without ``--setup`` / ``--only``, each venv runs the
set-ups it can (its frameworks installed, in the Haystack major version they need)::

    python3.11 -m venv /tmp/olfw
    /tmp/olfw/bin/pip install -r tests/data/otel_instrumentations/requirements-openllmetry-frameworks.txt
    /tmp/olfw/bin/python tests/data/otel_instrumentations/capture_openllmetry_frameworks.py --out /tmp/olfw_out
    python3.11 -m venv /tmp/olfw_h2
    sed -n 's/^#h2 //p' tests/data/otel_instrumentations/requirements-openllmetry-frameworks.txt > /tmp/h2.txt
    /tmp/olfw_h2/bin/pip install -r /tmp/h2.txt
    /tmp/olfw_h2/bin/python tests/data/otel_instrumentations/capture_openllmetry_frameworks.py --out /tmp/olfw_out
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, write_capture, run_setups
import capture_haystack  # the Haystack pipeline and service (and HAYSTACK_TELEMETRY_ENABLED=False)
import capture_llamaindex  # the documents

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
PREFIX = ""
CASES = ("stream", "non_stream", "stream_warm")
KEYS = (
    "traceloop.span.kind",
    "traceloop.entity.name",
    "traceloop.workflow",
    "gen_ai.operation",
    "gen_ai.system",
    "gen_ai.provider",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.usage",
    "gen_ai.request.stream",
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.is_streaming",
    "llm.",
    "stream",
    "first",
)
#: Set-up -> (framework, ttft-emit's helper on the LLM's client, the major version of haystack-ai it needs).
SETUPS: dict[str, tuple[str, bool, int | None]] = {
    "llamaindex_openllmetry": ("llamaindex", False, None),
    "llamaindex_openllmetry_helper": ("llamaindex", True, None),
    "haystack_openllmetry": ("haystack", False, 3),
    "haystack_openllmetry_helper": ("haystack", True, 3),
    "haystack2_openllmetry": ("haystack", False, 2),
    "haystack2_openllmetry_helper": ("haystack", True, 2),
}
DISTRIBUTIONS = {
    "llamaindex": (
        "llama-index-core",
        "llama-index-llms-openai",
        "llama-index-embeddings-openai",
        "opentelemetry-instrumentation-llamaindex",
    ),
    "haystack": ("haystack-ai", "opentelemetry-instrumentation-haystack"),
}
COMMON = (
    "opentelemetry-instrumentation-openai",
    "opentelemetry-semantic-conventions-ai",
    "openai",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-common",
)


class LlamaIndexRag:
    """The service: capture_llamaindex's index and query engine; ``ask(case)`` is one request."""

    question = capture.RagService.question

    def __init__(self, provider: Any, base_url: str, helper: bool, exporter: Any) -> None:
        from llama_index.core import Document, Settings, VectorStoreIndex
        from llama_index.embeddings.openai import OpenAIEmbedding
        from llama_index.llms.openai import OpenAI

        embed_model = OpenAIEmbedding(
            model=capture.EMBEDDING_MODEL, api_base=base_url, api_key="stub-key", embed_batch_size=1, max_retries=0
        )
        self.llm = OpenAI(model=capture.MODEL, api_base=base_url, api_key="stub-key", max_retries=0)
        Settings.embed_model, Settings.llm = embed_model, self.llm
        self.timing = None
        if helper:  # the service's one line (docs/otlp-mapping.md, "The helper"), on the LLM's (reused) client
            from ttft_emit.otel import time_first_chunk

            self.timing = time_first_chunk(self.llm._get_client(), tracer_provider=provider)
        docs = [Document(text=t) for t in capture_llamaindex.DOCS]
        self.index = VectorStoreIndex.from_documents(docs, embed_model=embed_model)
        provider.force_flush()
        exporter.clear()  # the indexing spans are not part of any request
        self.tracer = provider.get_tracer("rag-llamaindex")

    def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        streaming = case != "non_stream"
        engine = self.index.as_query_engine(llm=self.llm, streaming=streaming, similarity_top_k=2)
        first_chunk_ns, answer = None, ""
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            called_ns = time.time_ns()
            response = engine.query(self.question)
            if streaming:
                for token in response.response_gen:
                    if token and first_chunk_ns is None:
                        first_chunk_ns = time.time_ns()
                    answer += token
            else:
                answer = str(response)
            answered_ns = time.time_ns()
        assert answer.strip() == "".join(capture.CHUNKS), answer
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": streaming,
            "retrieval_attempts": 1,
            "called_ns": called_ns,
            "first_chunk_ns": first_chunk_ns,
            "answered_ns": answered_ns,
        }


def haystack_service(provider: Any, base_url: str, helper: bool) -> tuple[Any, Any]:
    """capture_haystack's pipeline and service; the helper on its generator's client."""
    pipe, generator = capture_haystack.build(base_url, prompt_builder=False)
    timing = None
    if helper:
        from ttft_emit.otel import time_first_chunk

        generator.warm_up()  # builds generator.client (an openai.OpenAI); Pipeline.run's warm-up keeps it
        timing = time_first_chunk(generator.client, tracer_provider=provider)
    return capture_haystack.HaystackRag(pipe, provider.get_tracer("rag-haystack")), timing


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    framework, helper, haystack_major = SETUPS[setup]
    instrumentor_error = None
    if haystack_major is not None:
        found_major = int(metadata.version("haystack-ai").split(".")[0])
        assert found_major == haystack_major, f"{setup} needs haystack-ai {haystack_major}.x, found {found_major}.x"
    exporter = InMemorySpanExporter()
    resource = {"service.name": f"rag-{framework}", "service.version": "1.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if framework == "llamaindex":
        from opentelemetry.instrumentation.llamaindex import LlamaIndexInstrumentor

        LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    else:
        from opentelemetry.instrumentation.haystack import HaystackInstrumentor

        try:
            HaystackInstrumentor().instrument(tracer_provider=provider)
        except Exception as e:  # Haystack 3: as traceloop's SDK does, log it and go on without it
            instrumentor_error = f"{type(e).__name__}: {e}"
            print(f"# HaystackInstrumentor().instrument() failed: {instrumentor_error}")
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    if helper:
        sys.path.insert(0, str(EMITTER_SRC))  # ttft_emit; its egg-info there gives its version
    server, base_url = capture.serve()
    if framework == "llamaindex":
        service: Any = LlamaIndexRag(provider, base_url, helper, exporter)
        timing = service.timing
    else:
        service, timing = haystack_service(provider, base_url, helper)
    truth, warm = [], None
    for case in CASES:
        truth.append(service.ask(case))
        if timing is not None and warm is None:
            warm = asdict(timing.stats)
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    ids = {t["trace_id"] for t in truth}
    stray = [s.name for s in spans if format(s.context.trace_id, "032x") not in ids]
    if stray:
        print(f"# spans outside the traces: {stray}")
    found = {name: metadata.version(name) for name in (*DISTRIBUTIONS[framework], *COMMON)}
    if helper:
        found["ttft-emit"] = metadata.version("ttft-emit")
    capture.write_capture(out, f"{PREFIX}{setup}", spans, truth, found, KEYS, timing=timing, warm=warm)
    if instrumentor_error is not None:
        doc_path = out / f"{PREFIX}{setup}.json"
        doc = json.loads(doc_path.read_text())
        doc = {**{k: v for k, v in doc.items() if k != "traces"}, "haystack_instrumentor_error": instrumentor_error}
        doc["traces"] = truth
        doc_path.write_text(json.dumps(doc, indent=1) + "\n")


def runnable_here() -> list[str]:
    """The set-ups this venv can run: its frameworks installed, its haystack-ai of the major version they need."""
    found = []
    for setup, (framework, _, haystack_major) in SETUPS.items():
        try:
            version = metadata.version(DISTRIBUTIONS[framework][0])
        except metadata.PackageNotFoundError:
            continue
        if haystack_major is None or int(version.split(".")[0]) == haystack_major:
            found.append(setup)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", choices=sorted(SETUPS), help="run one set-up (this process)")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(SETUPS), help="run these set-ups (default: those this venv can run)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.setup:
        run_setup(args.setup, args.out)
        return
    capture.run_setups(__file__, args.only or runnable_here(), args.out, PREFIX, timeout_s=180)


if __name__ == "__main__":
    main()
