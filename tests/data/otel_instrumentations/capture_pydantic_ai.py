"""Capture the spans a Pydantic AI service exports with Pydantic AI's own instrumentation (no Logfire, nothing sent
anywhere), against a loopback stub (:class:`ToolStubHandler`: capture_responses.py's, i.e. capture.py's OpenAI stub
plus ``POST /v1/responses`` with real SSE events, that answers a request offering tools with a tool call); write
``pydantic_ai_<set-up>.otlp`` (capture.py's ``write_traces``) and ``pydantic_ai_<set-up>.json`` (what the client
saw) into ``--out``, then print a span table.

Set-ups, each in its own process:

- ``pydantic_ai``: ``Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))``; the agents' models
  are ``OpenAIChatModel`` and ``OpenAIResponsesModel`` on one ``AsyncOpenAI`` client
  (``OpenAIProvider(openai_client=client)``). Pydantic AI makes an agent-run span (``invoke_agent <agent>``) and,
  per model request, a ``chat <model>`` CLIENT span (``gen_ai.operation.name = chat``) that runs until the stream
  is consumed; it records the time to first chunk as ``gen_ai.client.operation.time_to_first_chunk`` (seconds,
  from just before the request to the first event its stream hands the consumer) and no stream flag;
- ``pydantic_ai_helper``: the same with the client then timed by ttft-emit's helper, ``time_first_chunk(client,
  tracer_provider=provider)`` (from this repository's ``emitter/src``, put on ``sys.path``). The json also holds
  the helper's ``stats`` after the warm-up (``helper_stats_warm_up``) and at the end (``helper_stats``).

Each request is a trace: root span ``POST /ask`` (SERVER), a retrieval span (capture.py's ``retrieval_span``, GenAI
convention) around 50 ms of vector search, :data:`capture.PROMPT_WORK_S` of prompt work, then the agent, one of:

1. ``stream``: ``agent.run_stream()`` on chat completions, ``stream_text(delta=True, debounce_by=None)`` iterated;
2. ``non_stream``: ``agent.run()`` on chat completions;
3. ``responses_stream``: ``agent.run_stream()`` on the Responses API, ``stream_text`` as in 1;
4. ``events_stream``: ``agent.run_stream_events()`` on chat completions (the run in a background task);
5. ``tool_stream``: as 1 with the tool agent (below): ``chat`` (a streamed tool call), ``execute_tool``, ``chat``
   (the answer, streamed);
6. ``tool_non_stream``: as 2 with the tool agent;
7. ``tool_responses_stream``: as 3 with the tool agent: the first response's output is a ``function_call``.

The tool agent has one tool, ``lookup_capital(country)`` (:data:`TOOL_S` of work), and its own question. The stub
answers a request that offers tools and holds no tool result yet with a call of ``lookup_capital`` (chat completions:
a streamed tool call ending with ``finish_reason: "tool_calls"``, or a message with ``tool_calls``; Responses: a
``function_call`` output item streamed with the API's events, then ``response.completed``), and the request with the
tool's result (a ``tool`` message, a ``function_call_output`` input item) with its usual answer. So the request's
first token is the first token of its last model request, not of its first.

``first_event_ns`` is the first item the service's iteration gives (a text delta for ``stream_text``, any agent
stream event for ``run_stream_events``); ``first_chunk_ns`` the first one with non-empty text (with a tool: of the
final answer, the only text there is); ``answered_ns`` when the run's output is there. One warm-up run of each
case first, not written (imports, type building).

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/pyai
    /tmp/pyai/bin/pip install -r requirements-pydantic-ai.txt
    /tmp/pyai/bin/python capture_pydantic_ai.py --out /tmp/pyai_out [--only pydantic_ai ...]
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
import time
import uuid
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the retrieval conventions, write_traces, print_spans
import capture_responses  # the stub with POST /v1/responses
from capture_responses import _response

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = (
    "stream",
    "non_stream",
    "responses_stream",
    "events_stream",
    "tool_stream",
    "tool_non_stream",
    "tool_responses_stream",
)
KEYS = (
    "first",
    "token",
    "stream",
    "operation",
    "time",
    "span.kind",
    "model",
    "usage",
    "system",
    "agent",
    "finish",
    "tool",
)
SETUPS = ("pydantic_ai", "pydantic_ai_helper")
DISTRIBUTIONS = ("pydantic-ai-slim", "openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common")
TOOL = "lookup_capital"
#: The tool call's arguments as the stub streams them, :data:`capture.CHUNK_GAP_S` apart.
TOOL_ARGUMENTS = ('{"country"', ': "France"}')
#: The tool's own work.
TOOL_S = 0.030


async def lookup_capital(country: str) -> str:
    """The capital city of a country."""
    await asyncio.sleep(TOOL_S)
    return {"France": "Paris"}.get(country, "unknown")


class ToolStubHandler(capture_responses.ResponsesStubHandler):
    """capture_responses.py's stub that answers a request offering tools, and holding no tool result yet, with a
    call of :data:`TOOL`, after :data:`capture.FIRST_CHUNK_DELAY_S` (streamed) or
    :data:`capture.NON_STREAM_DELAY_S`; any other request as the stub does."""

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.loads(raw or b"{}")
        if not body.get("tools") or _has_tool_result(body):
            self.rfile = io.BytesIO(raw)  # the stub reads the body itself
            super().do_POST()
        elif self.path.endswith("/responses"):
            body["_ids"] = (f"resp_{uuid.uuid4().hex}", f"fc_{uuid.uuid4().hex}", f"call_{uuid.uuid4().hex}")
            if body.get("stream"):
                self._stream_function_call(body)
            else:
                time.sleep(capture.NON_STREAM_DELAY_S)
                output = [_function_call(body, "completed", "".join(TOOL_ARGUMENTS))]
                self._json(_response(body, "completed", output, capture_responses.USAGE) | {"tools": body["tools"]})
        elif body.get("stream"):
            self._stream_tool_call(body)
        else:
            time.sleep(capture.NON_STREAM_DELAY_S)
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
            call["function"] = {"name": TOOL, "arguments": "".join(TOOL_ARGUMENTS)}
            message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
            self._json({**self._chunk(body, [choice]), "object": "chat.completion", "usage": capture.USAGE})

    def _stream_tool_call(self, body: dict[str, Any]) -> None:
        """Chat completions: the tool call's name, then its arguments, then ``finish_reason: "tool_calls"``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        call = {"index": 0, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"}
        call["function"] = {"name": TOOL, "arguments": ""}
        delta: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
        self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        for part in TOOL_ARGUMENTS:
            time.sleep(capture.CHUNK_GAP_S)
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": part}}]}
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        self._event(self._chunk(body, [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**self._chunk(body, []), "usage": capture.USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _stream_function_call(self, body: dict[str, Any]) -> None:
        """Responses: the events of one ``function_call`` output item, then ``response.completed``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        seq = iter(range(1_000))
        send = lambda doc: self._sse({**doc, "sequence_number": next(seq)})  # noqa: E731
        respond = lambda status, output, usage: _response(body, status, output, usage) | {"tools": body["tools"]}  # noqa: E731
        send({"type": "response.created", "response": respond("in_progress", [], None)})
        send({"type": "response.in_progress", "response": respond("in_progress", [], None)})
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        where = {"item_id": body["_ids"][1], "output_index": 0}
        send({"type": "response.output_item.added", "output_index": 0, "item": _function_call(body, "in_progress", "")})
        for i, part in enumerate(TOOL_ARGUMENTS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            send({"type": "response.function_call_arguments.delta", **where, "delta": part})
        arguments = "".join(TOOL_ARGUMENTS)
        send({"type": "response.function_call_arguments.done", **where, "arguments": arguments})
        item = _function_call(body, "completed", arguments)
        send({"type": "response.output_item.done", "output_index": 0, "item": item})
        send({"type": "response.completed", "response": respond("completed", [item], capture_responses.USAGE)})


def _has_tool_result(body: dict[str, Any]) -> bool:
    """Whether a chat completions or Responses request holds a tool's result."""
    messages = body.get("messages") or []
    items = body["input"] if isinstance(body.get("input"), list) else []
    return any(m.get("role") == "tool" for m in messages) or any(i.get("type") == "function_call_output" for i in items)


def _function_call(body: dict[str, Any], status: str, arguments: str) -> dict[str, Any]:
    _, item_id, call_id = body["_ids"]
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": TOOL,
    }


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToolStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class PydanticAIService:
    """A RAG service whose answer is a Pydantic AI agent run."""

    question = "What is the capital of France?"
    tool_question = "What is the capital of France? Look it up."
    convention = "genai"

    def __init__(self, provider: Any, base_url: str) -> None:
        from openai import AsyncOpenAI
        from pydantic_ai import Agent
        from pydantic_ai.models.instrumented import InstrumentationSettings
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        self.tracer = provider.get_tracer("rag-api")
        self.client = AsyncOpenAI(base_url=base_url, api_key="stub-key", max_retries=0)
        Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))
        openai_provider = OpenAIProvider(openai_client=self.client)
        chat = OpenAIChatModel(capture.MODEL, provider=openai_provider)
        responses = OpenAIResponsesModel(capture.MODEL, provider=openai_provider)
        self.chat_agent = Agent(chat, name="assistant", instructions="Answer briefly.")
        self.responses_agent = Agent(responses, name="assistant", instructions="Answer briefly.")
        looked_up = "Answer briefly; look facts up with your tools."
        self.tool_agent = Agent(chat, name="assistant", instructions=looked_up, tools=[lookup_capital])
        self.tool_responses_agent = Agent(responses, name="assistant", instructions=looked_up, tools=[lookup_capital])

    async def call(self, case: str) -> dict[str, Any]:
        from pydantic_ai import AgentRunResultEvent
        from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta

        seen: dict[str, int | None] = {"first_event_ns": None, "first_chunk_ns": None}

        def see(text: str | None) -> None:
            now = time.time_ns()
            if seen["first_event_ns"] is None:
                seen["first_event_ns"] = now
            if seen["first_chunk_ns"] is None and text:
                seen["first_chunk_ns"] = now

        tool, responses = case.startswith("tool_"), "responses" in case
        if tool:
            agent, question = self.tool_responses_agent if responses else self.tool_agent, self.tool_question
        else:
            agent, question = self.responses_agent if responses else self.chat_agent, self.question
        called_ns = time.time_ns()
        if case.endswith("non_stream"):
            output = (await agent.run(question)).output
        elif case == "events_stream":
            output = None
            async with agent.run_stream_events(question) as events:
                async for event in events:
                    text = None
                    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                        text = event.part.content
                    elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                        text = event.delta.content_delta
                    elif isinstance(event, AgentRunResultEvent):
                        output = event.result.output
                        continue
                    see(text)
        else:
            async with agent.run_stream(question) as result:
                async for text in result.stream_text(delta=True, debounce_by=None):
                    see(text)
                output = await result.get_output()
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
        return {
            "case": case,
            "trace_id": trace_id,
            "streaming": not case.endswith("non_stream"),
            "retrieval_attempts": 1,
            **seen,
        }


async def _run(service: PydanticAIService, timing: Any) -> tuple[list[dict[str, Any]], Any]:
    for case in CASES:  # warm-up, not written (outside any root span: its own traces, dropped below)
        await service.call(case)
    warm = asdict(timing.stats) if timing is not None else None
    return [await service.ask(case) for case in CASES], warm


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    helper = setup.endswith("_helper")
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server, base_url = serve()
    service = PydanticAIService(provider, base_url)
    timing = None
    if helper:  # the service's one line, after the instrumentation is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(service.client, tracer_provider=provider)
    truth, warm = asyncio.run(_run(service, timing))
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    versions = {d: metadata.version(d) for d in DISTRIBUTIONS}
    capture.write_capture(out, setup, spans, truth, versions, KEYS, timing=timing, warm=warm)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "")


if __name__ == "__main__":
    main()
