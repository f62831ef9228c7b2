"""Capture the spans of a Haystack RAG pipeline (``haystack-ai``) traced by OpenInference's Haystack and OpenAI
instrumentors, or by Haystack's own OpenTelemetry tracing, against the loopback stub of ``capture.py``; write
``haystack_<set-up>.otlp`` (capture.py's ``write_traces``) and ``haystack_<set-up>.json`` (what the caller saw),
then print a span table (capture.py's ``print_spans``).

The pipeline: an ``InMemoryDocumentStore`` with three documents, ``InMemoryBM25Retriever`` ->
``ChatPromptBuilder`` -> ``OpenAIChatGenerator`` (``api_base_url`` the stub, ``Secret.from_token("stub")``), run
under a root span ``POST /ask`` (SERVER). A streaming case passes ``streaming_callback`` to the generator in the
run's data (Haystack's runtime override of the init parameter); the caller's first token is the first callback
whose chunk has non-empty content. Cases, one trace each, in this order (none before them, so ``stream`` is a cold
first request: the imports and the client's first connection are in it):

1. ``stream``: streaming;
2. ``non_stream``: the same pipeline without a callback (the stub answers after ``NON_STREAM_DELAY_S``);
3. ``stream_warm``: streaming again.

Set-ups, each in its own process (the instrumentors patch the same classes):

- ``openinference``: OpenInference's ``HaystackInstrumentor`` and ``OpenAIInstrumentor``, the set-up its guides
  give;
- ``openinference_haystack_only``: its Haystack instrumentor alone;
- ``openinference_helper``: both, and ttft-emit's helper on the generator's client (``time_first_chunk(
  generator.client)`` after ``generator.warm_up()``; Haystack builds that ``openai.OpenAI`` itself and keeps it);
- ``openinference_haystack_only_helper``: the Haystack instrumentor alone and the helper (no client span: the
  helper times the generator's ``LLM`` span, current at the call; OpenInference's ``OITracer`` keeps
  ``openinference.span.kind`` off the SDK span until the span ends, so the helper reads it from the span proxy,
  ``ttft_emit.otel.names_llm_call``: it found no LLM span before);
- ``openinference_haystack_only_fill``: the same with ``fill_missing=True`` (the helper's own ``chat <model>``
  inside the generator's span);
- ``openinference_promptbuilder``: both, with Haystack's (non-chat) ``PromptBuilder`` and a small component that
  wraps its string in a user ``ChatMessage``: OpenInference's Haystack instrumentor gives a ``PromptBuilder`` the
  span kind ``LLM`` (a ``ChatPromptBuilder`` is a ``CHAIN``);
- ``native``: Haystack's own tracing, ``haystack.tracing.enable_tracing(OpenTelemetryTracer(tracer))``
  (Haystack 3 moved ``OpenTelemetryTracer`` to the ``opentelemetry-haystack`` integration,
  ``haystack_integrations.tracing.opentelemetry``; Haystack 2.x had it in ``haystack.tracing.opentelemetry``),
  content tracing off (``HAYSTACK_CONTENT_TRACING_ENABLED`` unset);
- ``native_openai``: the same, and OpenInference's OpenAI instrumentor on the client;
- ``native_helper``: Haystack's tracing and the helper with ``fill_missing=True`` (no span of Haystack's names an
  LLM call, so the helper's own ``chat <model>`` is the only LLM span).

The helper comes from this repository's ``emitter/src`` (put on ``sys.path``); the json of a helper set-up has its
``stats`` after the first (cold) request, as ``helper_stats_warm_up``, and at the end. Haystack's telemetry is
turned off (``HAYSTACK_TELEMETRY_ENABLED=False``) before it is imported: nothing leaves loopback.

    python3.11 -m venv /tmp/hay
    /tmp/hay/bin/pip install -r tests/data/otel_instrumentations/requirements-haystack.txt
    /tmp/hay/bin/python tests/data/otel_instrumentations/capture_haystack.py --out /tmp/hay_out
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"  # before haystack is imported: no telemetry client
os.environ.pop("HAYSTACK_CONTENT_TRACING_ENABLED", None)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, write_capture, run_setups

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = ("stream", "non_stream", "stream_warm")
KEYS = (
    "span.kind",
    "component.type",
    "component.name",
    "gen_ai.",
    "llm.model",
    "llm.invocation",
    "llm.system",
    "llm.provider",
    "llm.token_count.prompt",
    "stream",
    "first",
    "operation",
    "execution_mode",
)
#: Set-up -> (tracing: "openinference" or "native", OpenInference's OpenAI instrumentor on, helper: None, "helper"
#: or "fill_missing", PromptBuilder instead of ChatPromptBuilder).
SETUPS: dict[str, tuple[str, bool, str | None, bool]] = {
    "openinference": ("openinference", True, None, False),
    "openinference_haystack_only": ("openinference", False, None, False),
    "openinference_helper": ("openinference", True, "helper", False),
    "openinference_haystack_only_helper": ("openinference", False, "helper", False),
    "openinference_haystack_only_fill": ("openinference", False, "fill_missing", False),
    "openinference_promptbuilder": ("openinference", True, None, True),
    "native": ("native", False, None, False),
    "native_openai": ("native", True, None, False),
    "native_helper": ("native", False, "fill_missing", False),
}
DOCS = (
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Seine flows through Paris.",
)
TEMPLATE = (
    "Answer the question from these documents.\n"
    "{% for doc in documents %}- {{ doc.content }}\n{% endfor %}\n"
    "Question: {{ question }}"
)


def _to_messages() -> Any:
    """A component that wraps ``PromptBuilder``'s string in a user ``ChatMessage`` (defined at module level: the
    Haystack instrumentor wraps a component class's ``run`` through its module)."""
    global ToMessages
    if "ToMessages" in globals():
        return ToMessages()
    from haystack import component
    from haystack.dataclasses import ChatMessage

    @component
    class ToMessages:
        @component.output_types(messages=list[ChatMessage])
        def run(self, prompt: str) -> dict[str, Any]:
            return {"messages": [ChatMessage.from_user(prompt)]}

    ToMessages.__qualname__ = "ToMessages"
    return ToMessages()


def build(base_url: str, prompt_builder: bool) -> tuple[Any, Any]:
    """The pipeline and its generator."""
    from haystack import Document, Pipeline
    from haystack.components.builders import ChatPromptBuilder, PromptBuilder
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.dataclasses import ChatMessage
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import Secret

    store = InMemoryDocumentStore()
    store.write_documents([Document(content=text) for text in DOCS])
    generator = OpenAIChatGenerator(
        api_key=Secret.from_token("stub"), model=capture.MODEL, api_base_url=base_url, max_retries=0
    )
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=2))
    if prompt_builder:
        pipe.add_component("prompt_builder", PromptBuilder(template=TEMPLATE, required_variables="*"))
        pipe.add_component("to_messages", _to_messages())
        pipe.add_component("llm", generator)
        pipe.connect("retriever.documents", "prompt_builder.documents")
        pipe.connect("prompt_builder.prompt", "to_messages.prompt")
        pipe.connect("to_messages.messages", "llm.messages")
    else:
        template = [
            ChatMessage.from_system("You answer from the documents you are given."),
            ChatMessage.from_user(TEMPLATE),
        ]
        pipe.add_component("prompt_builder", ChatPromptBuilder(template=template, required_variables="*"))
        pipe.add_component("llm", generator)
        pipe.connect("retriever.documents", "prompt_builder.documents")
        pipe.connect("prompt_builder.prompt", "llm.messages")
    return pipe, generator


class HaystackRag:
    """The service: ``ask(case)`` runs the pipeline under a root span ``POST /ask``."""

    question = capture.RagService.question

    def __init__(self, pipe: Any, tracer: Any) -> None:
        self.pipe, self.tracer = pipe, tracer

    def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        streaming = case != "non_stream"
        seen: dict[str, Any] = {"first_chunk_ns": None, "text": ""}

        def on_chunk(chunk: Any) -> None:
            if chunk.content:
                if seen["first_chunk_ns"] is None:
                    seen["first_chunk_ns"] = time.time_ns()
                seen["text"] += chunk.content

        data: dict[str, Any] = {"retriever": {"query": self.question}, "prompt_builder": {"question": self.question}}
        if streaming:
            data["llm"] = {"streaming_callback": on_chunk}
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            called_ns = time.time_ns()
            result = self.pipe.run(data)
            answered_ns = time.time_ns()
        answer = result["llm"]["replies"][0].text
        assert answer == "".join(capture.CHUNKS), answer
        if streaming:
            assert seen["text"] == answer, seen["text"]
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": streaming,
            "retrieval_attempts": 1,
            "called_ns": called_ns,
            "first_chunk_ns": seen["first_chunk_ns"] if streaming else None,
            "answered_ns": answered_ns,
        }


def versions(tracing: str, with_openai: bool, helper: str | None) -> dict[str, str]:
    names = ["haystack-ai"]
    if tracing == "openinference":
        names += ["openinference-instrumentation-haystack", "openinference-instrumentation"]
    else:
        names += ["opentelemetry-haystack"]
    if with_openai:
        names += ["openinference-instrumentation-openai"]
    names += ["openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common"]
    found = {name: metadata.version(name) for name in names}
    if helper:
        found["ttft-emit"] = metadata.version("ttft-emit")
    return found


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracing, with_openai, helper, prompt_builder = SETUPS[setup]
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-haystack", "service.version": "3.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if tracing == "openinference":
        from openinference.instrumentation.haystack import HaystackInstrumentor

        HaystackInstrumentor().instrument(tracer_provider=provider)
    else:
        from haystack import tracing as haystack_tracing
        from haystack_integrations.tracing.opentelemetry import OpenTelemetryTracer

        haystack_tracing.enable_tracing(OpenTelemetryTracer(provider.get_tracer("haystack")))
        assert not haystack_tracing.tracer.is_content_tracing_enabled
    if with_openai:
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
    server, base_url = capture.serve()
    pipe, generator = build(base_url, prompt_builder)
    timing = None
    if helper:
        sys.path.insert(0, str(EMITTER_SRC))  # ttft_emit; its egg-info there gives its version
        from ttft_emit.otel import time_first_chunk

        generator.warm_up()  # builds generator.client (an openai.OpenAI); Pipeline.run's warm-up keeps it
        timing = time_first_chunk(generator.client, tracer_provider=provider, fill_missing=helper == "fill_missing")
    service = HaystackRag(pipe, provider.get_tracer("rag-haystack"))
    truth, warm = [], None
    for case in CASES:
        truth.append(service.ask(case))
        if timing is not None and warm is None:
            warm = asdict(timing.stats)
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    found = versions(tracing, with_openai, helper)
    capture.write_capture(out, f"haystack_{setup}", spans, truth, found, KEYS, timing=timing, warm=warm)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "haystack_", timeout_s=180)


if __name__ == "__main__":
    main()
