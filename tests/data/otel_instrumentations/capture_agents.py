"""Capture the spans an OpenAI Agents SDK service exports under the agents instrumentations of OpenInference and
OpenLLMetry, against the loopback stub of capture_pydantic_ai.py (``ToolStubHandler``: capture_responses.py's, i.e.
capture.py's OpenAI stub plus ``POST /v1/responses`` with real SSE events, that answers a request offering tools, and
holding no tool result yet, with a call of ``lookup_capital``; a request offering no tools as capture_responses.py's
stub does); write ``agents_<set-up>.otlp`` (capture.py's ``write_traces``) and ``agents_<set-up>.json`` (what the
client saw) into ``--out`` (default: beside this file), then print a span table.

Set-ups, each in its own process (the instrumentors register Agents SDK trace processors and patch the client):

- ``openinference``: ``openinference-instrumentation-openai-agents`` (its processor replaces the SDK's exporter to
  OpenAI);
- ``openllmetry``: ``opentelemetry-instrumentation-openai-agents`` (``replace_existing_processors=True``: the same);
- ``openinference_openai`` / ``openllmetry_openai``: the same with that family's OpenAI instrumentor too, so the
  client's span runs inside the agents' LLM span;
- ``<any of them>_helper``: the service's client then timed by ttft-emit's helper, ``time_first_chunk(client,
  tracer_provider=provider)`` (from this repository's ``emitter/src``, put on ``sys.path``). The json also holds
  the helper's ``stats`` after the warm-up and at the end.

The SDK streams the Responses API through ``client.responses.with_streaming_response.create``: the call returns
the raw response, whose ``parse()`` gives the event stream. Its agents span (OpenInference's ``response``,
OpenLLMetry's ``openai.response``) runs from before the call to the stream's end and tells no first token.

Each request is a trace: root span ``POST /ask`` (SERVER), a retrieval span (capture.py's ``retrieval_span``, by
the family's convention) around 50 ms of vector search, :data:`capture.PROMPT_WORK_S` of prompt work, then the
agent, one of five cases:

1. ``stream``: ``Runner.run_streamed`` on the Responses API, ``stream_events()`` iterated;
2. ``non_stream``: ``Runner.run`` on the Responses API;
3. ``chat_stream``: the same agent on ``OpenAIChatCompletionsModel``, ``Runner.run_streamed``;
4. ``tool_stream``: as 1 with the tool agent (below): a model request answered with a streamed ``function_call``,
   the tool, then a model request answered with the usual streamed text;
5. ``tool_chat_stream``: as 3 with the tool agent (the first answer a streamed tool call ending with
   ``finish_reason: "tool_calls"``).

The tool agent has one ``@function_tool``, ``lookup_capital(country)`` (capture_pydantic_ai's ``TOOL_S`` of work,
answers ``"Paris"``), and its own question; the agents of cases 1-3 offer no tools, so the stub answers them as
before. So a tool case's first token is the first token of its last model request, not of its first.

``first_chunk_ns`` is when the service's ``stream_events()`` gives the first ``response.output_text.delta`` raw
event (``chat_stream`` too: the SDK turns chat chunks into Responses events; with a tool, of the final answer: the
tool turn gives function-call argument deltas, no text); ``answered_ns`` when the run's final output is there. One
warm-up run of each case first, not written (imports, type building).

    python -m venv /tmp/agents && /tmp/agents/bin/pip install -r requirements-agents.txt
    /tmp/agents/bin/python capture_agents.py [--only openinference openinference_helper ...]
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the retrieval conventions, write_traces, print_spans
import capture_pydantic_ai  # the stub that also answers with a tool call: ToolStubHandler, serve()

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = ("stream", "non_stream", "chat_stream", "tool_stream", "tool_chat_stream")
KEYS = (
    "first",
    "token",
    "stream",
    "operation",
    "time",
    "span.kind",
    "model",
    "invocation",
    "llm.system",
    "finish",
    "tool",
    "function",
)
FAMILIES = {
    "openinference": ("openinference-instrumentation-openai-agents", "openinference-instrumentation-openai"),
    "openllmetry": ("opentelemetry-instrumentation-openai-agents", "opentelemetry-instrumentation-openai"),
}
SETUPS = tuple(
    f"{family}{openai}{helper}" for helper in ("", "_helper") for family in FAMILIES for openai in ("", "_openai")
)
OTHER = ("openai-agents", "openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common")


def instrument(family: str, with_openai: bool, provider: Any) -> None:
    if family == "openinference":
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)  # exclusive_processor defaults to True
        if with_openai:
            from openinference.instrumentation.openai import OpenAIInstrumentor

            OpenAIInstrumentor().instrument(tracer_provider=provider)
    else:
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        OpenAIAgentsInstrumentor(replace_existing_processors=True).instrument(tracer_provider=provider)
        if with_openai:
            from opentelemetry.instrumentation.openai import OpenAIInstrumentor

            OpenAIInstrumentor().instrument(tracer_provider=provider)


class AgentService:
    """A RAG service whose answer is an OpenAI Agents SDK run."""

    question = "What is the capital of France?"
    tool_question = "What is the capital of France? Look it up."

    def __init__(self, family: str, provider: Any, base_url: str) -> None:
        from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_default_openai_client
        from openai import AsyncOpenAI

        self.convention = family
        self.tracer = provider.get_tracer("rag-api")
        self.client = AsyncOpenAI(base_url=base_url, api_key="stub-key", max_retries=0)
        # The stub key is never used to upload the SDK's own traces (its exporter is replaced anyway).
        set_default_openai_client(self.client, use_for_tracing=False)
        self.agent = Agent(name="Assistant", instructions="Answer briefly.", model=capture.MODEL)
        chat_model = OpenAIChatCompletionsModel(model=capture.MODEL, openai_client=self.client)
        self.chat_agent = Agent(name="Assistant", instructions="Answer briefly.", model=chat_model)

        @function_tool
        async def lookup_capital(country: str) -> str:
            """The capital city of a country."""
            await asyncio.sleep(capture_pydantic_ai.TOOL_S)
            return "Paris"

        assert lookup_capital.name == capture_pydantic_ai.TOOL  # the name the stub calls
        looked_up = "Answer briefly; look facts up with your tools."
        self.tool_agent = Agent(name="Assistant", instructions=looked_up, model=capture.MODEL, tools=[lookup_capital])
        self.tool_chat_agent = Agent(name="Assistant", instructions=looked_up, model=chat_model, tools=[lookup_capital])

    async def call(self, case: str) -> dict[str, Any]:
        from agents import Runner

        seen: dict[str, int | None] = {"first_event_ns": None, "first_chunk_ns": None}
        called_ns = time.time_ns()
        if case == "non_stream":
            output = (await Runner.run(self.agent, self.question)).final_output
        else:
            agent = {
                "stream": self.agent,
                "chat_stream": self.chat_agent,
                "tool_stream": self.tool_agent,
                "tool_chat_stream": self.tool_chat_agent,
            }[case]
            result = Runner.run_streamed(agent, self.tool_question if case.startswith("tool_") else self.question)
            async for event in result.stream_events():
                now = time.time_ns()
                if event.type != "raw_response_event":
                    continue
                if seen["first_event_ns"] is None:
                    seen["first_event_ns"] = now
                kind = getattr(event.data, "type", None)
                if seen["first_chunk_ns"] is None and kind == "response.output_text.delta":
                    seen["first_chunk_ns"] = now
            output = result.final_output
        answered_ns = time.time_ns()
        assert output == "".join(capture.CHUNKS), output
        return {"called_ns": called_ns, **seen, "answered_ns": answered_ns}

    async def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with capture.retrieval_span(self.tracer, self.convention, self.question):
                await asyncio.sleep(0.050)
            await asyncio.sleep(capture.PROMPT_WORK_S)
            seen = await self.call(case)
        trace_id = format(root.get_span_context().trace_id, "032x")
        return {"case": case, "trace_id": trace_id, "streaming": case != "non_stream", "retrieval_attempts": 1, **seen}


async def _run(service: AgentService, timing: Any) -> tuple[list[dict[str, Any]], Any]:
    for case in CASES:  # warm-up, not written
        await service.call(case)
    warm = asdict(timing.stats) if timing is not None else None
    return [await service.ask(case) for case in CASES], warm


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    family = setup.split("_")[0]
    with_openai, helper = "_openai" in setup, setup.endswith("_helper")
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument(family, with_openai, provider)
    server, base_url = capture_pydantic_ai.serve()
    service = AgentService(family, provider, base_url)
    timing = None
    if helper:  # the service's one line, after the instrumentors are set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(service.client, tracer_provider=provider)
    truth, warm = asyncio.run(_run(service, timing))
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    versions = {d: metadata.version(d) for d in FAMILIES[family][: 2 if with_openai else 1] + OTHER}
    capture.write_capture(out, f"agents_{setup}", spans, truth, versions, KEYS, timing=timing, warm=warm)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "agents_")


if __name__ == "__main__":
    main()
