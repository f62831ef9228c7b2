"""Capture the spans that OpenTelemetry's own GenAI instrumentations of frameworks export (the OpenTelemetry
project's, not OpenLLMetry's packages of similar names), against the loopback stubs of capture.py and
capture_pydantic_ai.py; write ``otel_contrib_<set-up>.otlp`` (capture.py's ``write_traces``) and
``otel_contrib_<set-up>.json`` (what the client saw) into ``--out``, then print a span table.

Which distributions are the OpenTelemetry project's (author "OpenTelemetry Authors"):

- LangChain: ``opentelemetry-instrumentation-genai-langchain`` (module
  ``opentelemetry.instrumentation.genai.langchain``, ``LangChainInstrumentor``). The name
  ``opentelemetry-instrumentation-langchain`` on the package registry is OpenLLMetry's (Traceloop's;
  capture_langchain.py's ``openllmetry``); the copy that opentelemetry-python-contrib kept under that name in
  ``instrumentation-genai/`` was never released and has been removed from there. The GenAI instrumentations now
  live in the opentelemetry-python-genai repository, released as ``opentelemetry-instrumentation-genai-*``.
- OpenAI Agents SDK: ``opentelemetry-instrumentation-genai-openai-agents`` (its successor line; module
  ``opentelemetry.instrumentation.genai.openai_agents``), and the older contrib release
  ``opentelemetry-instrumentation-openai-agents-v2`` 0.1.0 (module ``opentelemetry.instrumentation.openai_agents``,
  the same module as OpenLLMetry's agents package: a venv of its own).
- OpenAI client: ``opentelemetry-instrumentation-genai-openai`` (module ``opentelemetry.instrumentation.genai.openai``),
  the successor of ``opentelemetry-instrumentation-openai-v2`` (deprecated in contrib). openai-v2 2.4b0 needs
  ``opentelemetry-util-genai`` 1.1b0 (capture.py's requirements say why), the ``genai-*`` 1.3b0 packages need
  1.3b0: openai-v2 goes only with the older agents release, and with no LangChain instrumentation of the project.

Set-ups, each in its own process (the instrumentors patch the same classes):

- ``langchain_otel``: ``genai-langchain`` and ``genai-openai``, capture_langchain.py's chain (``EnsembleRetriever``
  of BM25 and a vector store, a prompt, ``ChatOpenAI``); ``langchain_otel_helper``: the same with ttft-emit's helper
  on the model's client (``time_first_chunk(llm.root_client)``, from this repository's ``emitter/src``). Cases
  ``stream``, ``non_stream`` (capture_langchain's ``ask``) and ``conversational_stream`` (capture_conversational.py's
  history-aware chain: a condense call, the retrieval, the streamed answer).
- ``agents_otel``: ``genai-openai-agents`` (``disable_openai_trace_export=True``: the SDK's own exporter off) and
  ``genai-openai``; ``agents_otel_agents_only``: the agents instrumentor alone; ``agents_otel_helper``: both and the
  helper on the SDK's client (``time_first_chunk(client)``, the ``AsyncOpenAI`` given to
  ``set_default_openai_client``).
- ``agents_otel_v2``: ``openai-agents-v2`` 0.1.0 (the SDK's default processor removed, as the other families' set-ups
  do) and ``openai-v2`` 2.4b0; ``agents_otel_v2_agents_only``; ``agents_otel_v2_helper``. Run with the second venv.

The agents service is capture_agents.py's ``AgentService`` (GenAI ``retrieval`` span, prompt work, then the run),
cases ``stream``, ``non_stream``, ``chat_stream``, ``tool_stream`` and ``tool_chat_stream`` (the json's
``first_chunk_ns`` is the first ``response.output_text.delta`` the service's ``stream_events()`` gives). One warm-up
run of each case first, not written.

    python3.11 -m venv /tmp/otcontrib
    /tmp/otcontrib/bin/pip install -r tests/data/otel_instrumentations/requirements-otel-contrib.txt
    /tmp/otcontrib/bin/python tests/data/otel_instrumentations/capture_otel_contrib.py --out /tmp/otcontrib_out \\
        --only langchain_otel langchain_otel_helper agents_otel agents_otel_agents_only agents_otel_helper
    # the older agents release, in a second venv (requirements-otel-contrib.txt's ``#v2`` lines):
    python3.11 -m venv /tmp/otcontrib_v2
    sed -n 's/^#v2 //p' tests/data/otel_instrumentations/requirements-otel-contrib.txt > /tmp/otcontrib_v2.txt
    /tmp/otcontrib_v2/bin/pip install -r /tmp/otcontrib_v2.txt
    /tmp/otcontrib_v2/bin/python tests/data/otel_instrumentations/capture_otel_contrib.py --out /tmp/otcontrib_out \\
        --only agents_otel_v2 agents_otel_v2_agents_only agents_otel_v2_helper
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # write_capture, setup_main, the stub

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
#: Set-up -> (framework, instrumentation line, the OpenAI instrumentor on, ttft-emit's helper on the client).
SETUPS: dict[str, tuple[str, str, bool, bool]] = {
    "langchain_otel": ("langchain", "genai", True, False),
    "langchain_otel_helper": ("langchain", "genai", True, True),
    "agents_otel": ("agents", "genai", True, False),
    "agents_otel_agents_only": ("agents", "genai", False, False),
    "agents_otel_helper": ("agents", "genai", True, True),
    "agents_otel_v2": ("agents", "v2", True, False),
    "agents_otel_v2_agents_only": ("agents", "v2", False, False),
    "agents_otel_v2_helper": ("agents", "v2", True, True),
}
LANGCHAIN_CASES = (("stream", True), ("non_stream", False))
AGENT_CASES = ("stream", "non_stream", "chat_stream", "tool_stream", "tool_chat_stream")
DISTRIBUTIONS = {
    ("langchain", "genai"): (
        "opentelemetry-instrumentation-genai-langchain",
        "opentelemetry-instrumentation-genai-openai",
        "opentelemetry-util-genai",
        "langchain",
        "langchain-core",
        "langchain-classic",
        "langchain-openai",
        "langchain-community",
    ),
    ("agents", "genai"): (
        "opentelemetry-instrumentation-genai-openai-agents",
        "opentelemetry-instrumentation-genai-openai",
        "opentelemetry-util-genai",
        "openai-agents",
    ),
    ("agents", "v2"): (
        "opentelemetry-instrumentation-openai-agents-v2",
        "opentelemetry-instrumentation-openai-v2",
        "opentelemetry-util-genai",
        "openai-agents",
    ),
}
OTHER = ("openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common")
KEYS = ("gen_ai", "stream", "finish", "first", "tool", "time_to", "span.kind", "error")


def instrument(framework: str, line: str, with_openai: bool, provider: Any) -> None:
    """The framework's instrumentor of ``line`` and, ``with_openai``, that line's OpenAI instrumentor."""
    if framework == "langchain":
        from opentelemetry.instrumentation.genai.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument(tracer_provider=provider)
    elif line == "genai":
        from opentelemetry.instrumentation.genai.openai_agents import OpenAIAgentsInstrumentor

        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider, disable_openai_trace_export=True)
    else:
        from agents.tracing import set_trace_processors
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        instrumentor = OpenAIAgentsInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        set_trace_processors([instrumentor._processor])  # the SDK's exporter to OpenAI off: its processor alone
    if not with_openai:
        return
    if line == "genai":
        from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
    else:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    OpenAIInstrumentor().instrument(tracer_provider=provider)


def _stats(timing: Any) -> dict[str, int] | None:
    return asdict(timing.stats) if timing is not None else None


def langchain_truth(provider: Any, exporter: Any, helper: bool) -> tuple[list[dict[str, Any]], Any, Any]:
    """capture_langchain's chain (cases ``stream``, ``non_stream``) and capture_conversational's
    (``conversational_stream``), each with the helper on its model's client when ``helper``."""
    import capture_conversational
    import capture_langchain

    server, base_url = capture.serve()
    rag = capture_langchain.LangChainRag(provider, base_url)
    conversational = capture_conversational.ConversationalRag(provider, base_url, helper)
    for case, streaming in LANGCHAIN_CASES:  # warm-up, not written
        rag.ask(case, streaming, helper)
    conversational.call()
    timing = None
    if helper:  # the process's helper, which LangChainRag.chain's time_first_chunk(llm.root_client) set up
        from ttft_emit import otel

        timing = otel._DEFAULT
    warm = _stats(timing)
    exporter.clear()
    truth = [rag.ask(case, streaming, helper) for case, streaming in LANGCHAIN_CASES]
    truth.append(conversational.ask())
    server.shutdown()
    return truth, timing, warm


def agents_truth(provider: Any, exporter: Any, helper: bool) -> tuple[list[dict[str, Any]], Any, Any]:
    """capture_agents's service, its cases :data:`AGENT_CASES`."""
    import capture_agents
    import capture_pydantic_ai

    server, base_url = capture_pydantic_ai.serve()
    service = capture_agents.AgentService("genai", provider, base_url)  # the GenAI retrieval span
    timing = None
    if helper:  # the service's one line, after the instrumentors are set up
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(service.client, tracer_provider=provider)

    async def runs() -> tuple[list[dict[str, Any]], Any]:
        for case in AGENT_CASES:  # warm-up, not written
            await service.call(case)
        warm = _stats(timing)
        exporter.clear()
        return [await service.ask(case) for case in AGENT_CASES], warm

    truth, warm = asyncio.run(runs())
    server.shutdown()
    return truth, timing, warm


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    framework, line, with_openai, helper = SETUPS[setup]
    exporter = InMemorySpanExporter()
    service_name = "rag-langchain" if framework == "langchain" else "rag-api"
    resource = {"service.name": service_name, "service.version": "2.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(framework, line, with_openai, provider)
    sys.path.insert(0, str(EMITTER_SRC))  # ttft_emit for the helper; its egg-info gives its version
    run = langchain_truth if framework == "langchain" else agents_truth
    truth, timing, warm = run(provider, exporter, helper)
    provider.force_flush()
    spans = exporter.get_finished_spans()
    names = DISTRIBUTIONS[framework, line]
    if not with_openai:
        names = tuple(n for n in names if "openai-v2" not in n and not n.endswith("genai-openai"))
    versions = {n: metadata.version(n) for n in (*names, *OTHER)}
    if helper:
        versions["ttft-emit"] = metadata.version("ttft-emit")
    name = f"otel_contrib_{setup}"
    capture.write_capture(out, name, spans, truth, versions, KEYS, helper=helper, timing=timing, warm=warm)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "otel_contrib_", timeout_s=240)


if __name__ == "__main__":
    main()
