"""Capture the spans an agent with one tool call exports under the unmodified OpenAI instrumentations of capture.py:
the first model turn streams a tool call, the service runs the tool, the second model turn streams the answer.

The stub is capture.py's OpenAI chat-completions stub (:class:`capture.StubHandler`) plus tool calls: a chat
request that offers ``tools`` and holds no ``role: "tool"`` message is answered with a call of ``lookup_capital``
(arguments ``{"country": "France"}``), in the real OpenAI wire shapes:

- streamed: the first chunk (``delta.role`` and ``tool_calls[0]`` with its id, type and function name, empty
  arguments) after :data:`capture.FIRST_CHUNK_DELAY_S`, then the argument pieces :data:`capture.CHUNK_GAP_S` apart,
  a last chunk with ``finish_reason: "tool_calls"``, and the usage chunk when ``stream_options.include_usage``;
- not streamed: one message with ``tool_calls`` (``content: null``), ``finish_reason: "tool_calls"``, after
  :data:`capture.NON_STREAM_DELAY_S`.

A request holding the tool's result gets capture.py's answer (:data:`capture.CHUNKS`, streamed or not).

Each request is a trace: root span ``POST /ask`` (SERVER), the retrieval span of the library's convention
(capture.py's ``retrieval_span``: ``openinference`` for OpenInference, GenAI otherwise) around 50 ms of vector
search, :data:`capture.PROMPT_WORK_S` of prompt work, then

1. turn 1: ``chat.completions.create(..., tools=[lookup_capital])``;
2. the tool: a span of the library's convention (OpenInference: kind ``TOOL``, named ``lookup_capital``; GenAI:
   ``gen_ai.operation.name = execute_tool``, named ``execute_tool lookup_capital``) around 30 ms of work;
3. turn 2: the same call with the assistant's tool call and the tool's result appended.

Cases: ``tool_stream`` (both turns ``stream=True``, ``stream_options.include_usage``) and ``tool_non_stream`` (both
turns plain). What the client saw per trace (``<name>.json``): ``called_ns`` (just before turn 1, also
``turn1_called_ns``), ``turn1_first_chunk_ns`` (turn 1's first chunk: the tool call's; streaming only),
``turn1_done_ns`` (turn 1's stream consumed / answer received), ``turn2_called_ns``, ``first_chunk_ns`` (turn 2's
first chunk with text content: what the user sees first; streaming only), ``answered_ns`` (turn 2 done).

Set-ups, each in its own process (the libraries patch the same client): ``openinference``, ``openllmetry``,
``openai_v2`` (capture.py's ``instrument``), each also ``<library>_helper``: the client then timed by ttft-emit's
helper, ``time_first_chunk(client, tracer_provider=provider)`` (from this repository's ``emitter/src``, put on
``sys.path``), the json with the helper's ``stats`` after the warm-up and at the end. One warm-up run of each case
first (no root span), not written. Outputs ``tools_<set-up>.otlp`` (capture.py's ``write_traces``) and
``tools_<set-up>.json`` in ``--out``.

    python3.11 -m venv /tmp/instr && /tmp/instr/bin/pip install -r requirements.txt
    /tmp/instr/bin/python capture_tools.py --out /tmp/tools_out [--only openinference openai_v2_helper ...]
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, instrument, the retrieval conventions, write_traces, print_spans, versions

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = ("tool_stream", "tool_non_stream")
SETUPS = tuple(f"{library}{helper}" for helper in ("", "_helper") for library in capture.LIBRARIES)
KEYS = ("finish", "stop_reason", "tool", "first", "stream", "operation", "span.kind", "time_to")

TOOL_NAME = "lookup_capital"
TOOL_ARGUMENTS = {"country": "France"}
#: The streamed pieces of the tool call's arguments (they join to ``json.dumps(TOOL_ARGUMENTS)``'s compact form).
ARGUMENT_PIECES = ('{"', "country", '":"', "France", '"}')
TOOL_CALL_ID = "call_stub_lookup_capital"
TOOL_RESULT = "Paris"
TOOL_WORK_S = 0.030
TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "The capital city of a country.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string", "description": "The country's name."}},
            "required": ["country"],
            "additionalProperties": False,
        },
    },
}
TOOL_USAGE = {
    "prompt_tokens": 864,
    "completion_tokens": 16,
    "total_tokens": 880,
    "prompt_tokens_details": {"cached_tokens": 512},
}


class ToolStubHandler(capture.StubHandler):
    """capture.py's stub; a chat request offering ``tools`` without a tool result gets a ``lookup_capital`` call."""

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.loads(raw or b"{}")
        messages = body.get("messages") or []
        if (
            self.path.endswith("/chat/completions")
            and body.get("tools")
            and not any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
        ):
            if body.get("stream"):
                self._stream_tool_call(body)
            else:
                self._tool_call(body)
            return
        self.rfile = io.BytesIO(raw)  # capture.py's handler reads the body again
        super().do_POST()

    def _tool_call(self, body: dict[str, Any]) -> None:
        time.sleep(capture.NON_STREAM_DELAY_S)
        call = {
            "id": TOOL_CALL_ID,
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": "".join(ARGUMENT_PIECES)},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None}
        self._json(
            {
                "id": "chatcmpl-stub-tool",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}],
                "usage": TOOL_USAGE,
            }
        )

    def _stream_tool_call(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        first = {
            "index": 0,
            "id": TOOL_CALL_ID,
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": ""},
        }
        delta: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [first], "refusal": None}
        self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        for piece in ARGUMENT_PIECES:
            time.sleep(capture.CHUNK_GAP_S)
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        self._event(self._chunk(body, [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**self._chunk(body, []), "usage": TOOL_USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToolStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class ToolAgentService:
    """The service: ``ask(case)`` is one request, a trace; ``turns(case)`` the agent's two model turns and tool."""

    question = "What is the capital of France?"

    def __init__(self, library: str, provider: Any, base_url: str) -> None:
        import openai

        self.library = library
        self.convention = "openinference" if library == "openinference" else "genai"
        self.tracer = provider.get_tracer("rag-api")
        self.client = openai.OpenAI(base_url=base_url, api_key="stub-key", max_retries=0)

    def run_tool(self, call_id: str, name: str, arguments: str) -> str:
        """The tool, inside a span of the library's convention."""
        from opentelemetry.trace import SpanKind

        assert name == TOOL_NAME and json.loads(arguments) == TOOL_ARGUMENTS, (name, arguments)
        if self.convention == "openinference":
            attrs = {
                "openinference.span.kind": "TOOL",
                "tool.name": name,
                "tool.description": TOOL_SCHEMA["function"]["description"],
                "tool.parameters": json.dumps(TOOL_SCHEMA["function"]["parameters"]),
                "input.value": arguments,
                "input.mime_type": "application/json",
            }
            with self.tracer.start_as_current_span(name, attributes=attrs) as span:
                time.sleep(TOOL_WORK_S)
                span.set_attribute("output.value", TOOL_RESULT)
        else:
            attrs = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.description": TOOL_SCHEMA["function"]["description"],
            }
            with self.tracer.start_as_current_span(f"execute_tool {name}", kind=SpanKind.INTERNAL, attributes=attrs):
                time.sleep(TOOL_WORK_S)
        return TOOL_RESULT

    def turns(self, case: str) -> dict[str, Any]:
        """Turn 1 (the tool call), the tool, turn 2 (the answer); when the client saw what."""
        streaming = case == "tool_stream"
        extra: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}} if streaming else {}
        messages: list[Any] = [{"role": "user", "content": self.question}]
        seen: dict[str, int | None] = {"turn1_first_chunk_ns": None, "first_chunk_ns": None}

        called_ns = time.time_ns()
        first = self.client.chat.completions.create(
            model=capture.MODEL, messages=messages, tools=[TOOL_SCHEMA], **extra
        )
        if streaming:
            call_id, name, arguments = "", "", ""
            for chunk in first:
                if seen["turn1_first_chunk_ns"] is None:
                    seen["turn1_first_chunk_ns"] = time.time_ns()
                for choice in chunk.choices:
                    for tc in choice.delta.tool_calls or ():
                        call_id += tc.id or ""
                        if tc.function is not None:
                            name += tc.function.name or ""
                            arguments += tc.function.arguments or ""
        else:
            (tc,) = first.choices[0].message.tool_calls
            call_id, name, arguments = tc.id, tc.function.name, tc.function.arguments
        turn1_done_ns = time.time_ns()

        result = self.run_tool(call_id, name, arguments)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
        ]

        turn2_called_ns = time.time_ns()
        second = self.client.chat.completions.create(
            model=capture.MODEL, messages=messages, tools=[TOOL_SCHEMA], **extra
        )
        if streaming:
            text = ""
            for chunk in second:
                for choice in chunk.choices:
                    if choice.delta.content:
                        if seen["first_chunk_ns"] is None:
                            seen["first_chunk_ns"] = time.time_ns()
                        text += choice.delta.content
        else:
            text = second.choices[0].message.content
        answered_ns = time.time_ns()
        assert text == "".join(capture.CHUNKS), text
        return {
            "called_ns": called_ns,
            "first_chunk_ns": seen["first_chunk_ns"],
            "answered_ns": answered_ns,
            "turn1_called_ns": called_ns,
            "turn1_first_chunk_ns": seen["turn1_first_chunk_ns"],
            "turn1_done_ns": turn1_done_ns,
            "turn2_called_ns": turn2_called_ns,
        }

    def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with capture.retrieval_span(self.tracer, self.convention, self.question):
                time.sleep(0.050)  # the vector search
            time.sleep(capture.PROMPT_WORK_S)
            seen = self.turns(case)
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": case == "tool_stream",
            "retrieval_attempts": 1,
            **seen,
        }


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    helper = setup.endswith("_helper")
    library = setup.removesuffix("_helper")
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = capture.instrument(library, resource, [SimpleSpanProcessor(exporter)])
    server, base_url = serve()
    service = ToolAgentService(library, provider, base_url)
    timing = None
    if helper:  # the service's one line, after the instrumentor is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(service.client, tracer_provider=provider)
    for case in CASES:  # warm-up, not written
        service.turns(case)
    warm = asdict(timing.stats) if timing is not None else None
    exporter.clear()
    truth = [service.ask(case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    versions = capture.versions(library)
    capture.write_capture(out, f"tools_{setup}", spans, truth, versions, KEYS, timing=timing, warm=warm)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "tools_")


if __name__ == "__main__":
    main()
