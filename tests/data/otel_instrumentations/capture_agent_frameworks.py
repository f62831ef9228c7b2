"""Capture the spans OpenInference's instrumentors for three agent frameworks, DSPy, smolagents and CrewAI, export
(each with OpenInference's LiteLLM or OpenAI instrumentor beside it, as the Phoenix guides set them up) when the
framework answers through an OpenAI-compatible model on a loopback stub, streaming and not; write
``<set-up>.otlp`` (capture.py's ``write_traces``) and ``<set-up>.json`` (what the caller saw) into ``--out``,
then print a span table.

The stub (:class:`AgentStubHandler`, chat completions; embeddings and ``/responses`` as capture_responses.py's)
sends the first chunk :data:`capture.FIRST_CHUNK_DELAY_S` after the request and the others
:data:`capture.CHUNK_GAP_S` apart (a plain answer after :data:`capture.NON_STREAM_DELAY_S`), and answers by
what the request asks:

- a DSPy ``ChatAdapter`` prompt (its last user message names the output fields, ``[[ ## <field> ## ]]``): the
  fields in DSPy's format, each marker in two pieces (``[[ ## answer``, `` ## ]]\\n``), then the value's tokens,
  then ``[[ ## completed ## ]]``. So the model's first chunk is a marker, which no caller sees: DSPy's
  ``StreamListener`` gives the caller the first token of the value (``Paris``, two chunk gaps later for a
  ``question -> answer`` predictor). ``dspy.ReAct`` asks for ``next_thought``, ``next_tool_name``,
  ``next_tool_args``: ``lookup_capital`` while the trajectory has no observation, then ``finish``; its extract
  step (``ChainOfThought``) gets ``reasoning`` (6 tokens) then ``answer``. DSPy's tool calls are text, not the
  API's ``tools``;
- a request offering ``tools`` (capture_tools.py's behaviour): with ``lookup_capital`` offered (under any name
  holding it) and no tool result yet (a ``role: "tool"`` message; smolagents: a user message ``Observation:``),
  a call of it (``{"country": "France"}``); with smolagents' ``final_answer`` offered otherwise, a call of
  ``final_answer`` with ``{"answer": "Paris is the capital."}`` (its arguments streamed as ``{"answer": "``,
  ``Paris``, `` is``, `` the``, `` capital``, ``."}``); streamed: the first chunk holds the call's id and name, the
  argument pieces follow, then ``finish_reason: "tool_calls"``;
- anything else: capture.py's answer, :data:`capture.CHUNKS`.

Each reply is logged with its server-side times (request received, first chunk written, reply done): the json's
``stub`` list, by ``received_ns``.

Each request is a trace: root span ``POST /ask`` (SERVER), an OpenInference ``RETRIEVER`` span
(capture.py's ``retrieval_span``) around 50 ms of vector search, :data:`capture.PROMPT_WORK_S` of prompt work,
then the framework. What the caller saw per trace: ``called_ns`` (just before the framework is called),
``first_event_ns`` (the first item the caller's iteration gives, streaming only), ``first_chunk_ns`` (the first
text the caller sees, streaming only; per framework below), ``answered_ns`` (the answer is there) and ``done_ns``
(the iteration or call returned). One warm-up run of each case first (no root span), not written.

Set-ups, each in its own process (:data:`SETUPS`), all instrumentors given our tracer provider (also set
globally, as Phoenix's ``register()`` does), and their cases (each: ``stream``, ``non_stream``, ``tool_stream``,
``tool_non_stream``):

- DSPy (``dspy``): ``dspy.LM("openai/gpt-4o-mini", api_base=<stub>, cache=False, num_retries=0)``.
  ``stream``: ``dspy.streamify(dspy.Predict("question -> answer"), stream_listeners=[StreamListener(
  signature_field_name="answer")])`` (a new listener per request: one serves one stream), iterated
  (``first_chunk_ns``: the first ``StreamResponse`` with text); ``non_stream``: ``await predict.acall(...)``;
  ``tool_stream``: the same streamify around ``dspy.ReAct("question -> answer", tools=[lookup_capital])``
  (three model calls: the tool call, ``finish``, the extract step; only the predictor a listener names is
  streamed, so the first two are plain calls); ``tool_non_stream``: ``await react.acall(...)``.

  - ``dspy_openinference``: ``DSPyInstrumentor`` and ``LiteLLMInstrumentor`` (Phoenix's DSPy guide: "DSPy uses
    LiteLLM under the hood"), DSPy's default engine. DSPy 3.4 picks its vendored native client (lm15, its own
    HTTP transport, chat completions) for this model: LiteLLM is never imported, its instrumentor sees nothing;
  - ``dspy_openinference_litellm``: the same with ``engine="litellm"`` (the LiteLLM path the guide assumes);
  - ``dspy_openinference_openai``: that and ``OpenAIInstrumentor`` too (``register(auto_instrument=True)`` with
    both installed): LiteLLM sends the request through an ``openai`` client's ``post``;
  - ``dspy_openinference_helper``: ``dspy_openinference_litellm`` with ttft-emit's helper on the module DSPy
    calls, ``time_first_chunk(litellm, tracer_provider=provider)`` (from this repository's ``emitter/src``); the
    native engine has no client object to give it;
  - ``dspy_openinference_marked``: ``dspy_openinference_openai`` with the caller's iteration wrapped in ttft-emit's
    ``first_token_marked`` (``ttft_emit.otel_marks``): a zero-length span ``ttft.stage = first_token`` at the first
    ``StreamResponse`` with text.

- smolagents (``smolagents``): a ``ToolCallingAgent`` (``max_steps=4``) on ``OpenAIModel`` (the ``openai``
  client), run in a worker thread (smolagents is synchronous). It answers by calling its ``final_answer`` tool;
  with ``lookup_capital`` (``@tool``) it calls that first, then ``final_answer``. ``stream``: ``stream_outputs=True``
  and ``agent.run(question, stream=True)`` iterated: ``first_chunk_ns`` is the first stream delta whose turn's text
  (content and tool-call arguments) holds the answer (``Paris``, two chunk gaps after the turn's first delta, the
  ``final_answer`` call's name); ``turn_first_delta_ns`` the first delta of each model turn;
  ``non_stream``: ``agent.run(question)``.

  - ``smolagents_openinference``: ``SmolagentsInstrumentor`` and ``OpenAIInstrumentor``;
  - ``smolagents_openinference_helper``: the same and ``time_first_chunk(model.client)``.

- CrewAI (``crewai``): a ``Crew`` of one ``Agent`` and one ``Task`` per request, the agent's
  ``LLM(model="openai/gpt-4o-mini", base_url=<stub>, stream=...)`` (CrewAI 1.x's native OpenAI provider: the
  ``openai`` client, not LiteLLM), kicked off in a worker thread. ``stream``: ``stream=True`` on the LLM and on the
  crew, ``kickoff()``'s ``CrewStreamingOutput`` iterated (``first_chunk_ns``: the first ``text`` chunk);
  ``non_stream``: ``kickoff()``; ``tool_*``: the agent has ``lookup_capital`` (``crewai.tools.tool``), called
  natively (``tools``; the result as a ``tool`` message).

  - ``crewai_openinference``: ``CrewAIInstrumentor`` and ``LiteLLMInstrumentor`` (Phoenix's CrewAI guide, "for
    CrewAI >= 0.63");
  - ``crewai_openinference_openai``: and ``OpenAIInstrumentor`` (``register(auto_instrument=True)``);
  - ``crewai_openinference_helper``: that and ``time_first_chunk(client)`` on each LLM's ``openai`` client
    (``llm._get_sync_client()``, which CrewAI builds once per LLM);
  - ``crewai_openinference_fill``: ``crewai_openinference`` (no OpenAI instrumentor) and the helper with
    ``fill_missing=True`` (its own ``chat <model>`` span per call);
  - ``crewai_openinference_events``: ``crewai_openinference`` with the instrumentor's event-listener mode,
    ``CrewAIInstrumentor().instrument(use_event_listener=True)`` (LLM spans ``<model>.llm_call`` from CrewAI's
    events).

``--out`` defaults to this folder; the captures of record were written to a scratch folder.

    python3.11 -m venv /tmp/agfw
    /tmp/agfw/bin/pip install -r requirements-agent-frameworks.txt
    /tmp/agfw/bin/python capture_agent_frameworks.py --out /tmp/agfw_out [--only dspy_openinference ...]
"""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub's answer and delays, retrieval_span, write_capture, print_spans
import capture_responses  # the stub with POST /v1/responses

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
#: Instrumentor name -> (distribution, module, class).
INSTRUMENTORS: dict[str, tuple[str, str, str]] = {
    "dspy": ("openinference-instrumentation-dspy", "openinference.instrumentation.dspy", "DSPyInstrumentor"),
    "smolagents": (
        "openinference-instrumentation-smolagents",
        "openinference.instrumentation.smolagents",
        "SmolagentsInstrumentor",
    ),
    "crewai": ("openinference-instrumentation-crewai", "openinference.instrumentation.crewai", "CrewAIInstrumentor"),
    "litellm": (
        "openinference-instrumentation-litellm",
        "openinference.instrumentation.litellm",
        "LiteLLMInstrumentor",
    ),
    "openai": ("openinference-instrumentation-openai", "openinference.instrumentation.openai", "OpenAIInstrumentor"),
}
#: Set-up -> its instrumentors (in this order, on our provider), options: ``engine`` (DSPy's), ``helper``
#: (ttft-emit's, ``"wrap"`` or ``"fill"``: ``fill_missing=True``), ``instrument`` (keyword arguments of the
#: framework's instrumentor).
SETUPS: dict[str, dict[str, Any]] = {
    "dspy_openinference": {"instrumentors": ("dspy", "litellm"), "engine": "auto"},
    "dspy_openinference_litellm": {"instrumentors": ("dspy", "litellm"), "engine": "litellm"},
    "dspy_openinference_openai": {"instrumentors": ("dspy", "litellm", "openai"), "engine": "litellm"},
    "dspy_openinference_helper": {"instrumentors": ("dspy", "litellm"), "engine": "litellm", "helper": "wrap"},
    "dspy_openinference_marked": {"instrumentors": ("dspy", "litellm", "openai"), "engine": "litellm", "mark": True},
    "smolagents_openinference": {"instrumentors": ("smolagents", "openai")},
    "smolagents_openinference_helper": {"instrumentors": ("smolagents", "openai"), "helper": "wrap"},
    "crewai_openinference": {"instrumentors": ("crewai", "litellm")},
    "crewai_openinference_openai": {"instrumentors": ("crewai", "litellm", "openai")},
    "crewai_openinference_helper": {"instrumentors": ("crewai", "litellm", "openai"), "helper": "wrap"},
    "crewai_openinference_fill": {"instrumentors": ("crewai", "litellm"), "helper": "fill"},
    "crewai_openinference_events": {
        "instrumentors": ("crewai", "litellm"),
        "instrument": {"use_event_listener": True},
    },
}
CASES = {
    "dspy": ("stream", "non_stream", "tool_stream", "tool_non_stream"),
    "smolagents": ("stream", "non_stream", "tool_stream", "tool_non_stream"),
    "crewai": ("stream", "non_stream", "tool_stream", "tool_non_stream"),
}
KEYS = (
    "span.kind",
    "llm.model",
    "llm.provider",
    "llm.system",
    "invocation",
    "finish",
    "stream",
    "first",
    "gen_ai",
    "token_count",
    "tool.name",
)
COMMON = (
    "openinference-instrumentation",
    "openinference-semantic-conventions",
    "openai",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-common",
)
DISTRIBUTIONS = {"dspy": ("dspy", "litellm"), "smolagents": ("smolagents",), "crewai": ("crewai", "litellm")}
QUESTION = "What is the capital of France?"
TOOL_QUESTION = "What is the capital of France? Look it up."
ANSWER = "".join(capture.CHUNKS)
TOOL = "lookup_capital"
TOOL_S = 0.030
RETRIEVAL_S = 0.050
#: A DSPy field's value tokens, by field name (``answer``: capture.py's chunks).
DSPY_VALUES: dict[str, tuple[str, ...]] = {
    "answer": capture.CHUNKS,
    "reasoning": ("The", " capital", " of", " France", " is", " Paris."),
}
FINAL_ANSWER_PIECES = ('{"answer": "', *capture.CHUNKS[:-1], capture.CHUNKS[-1] + '"}')
LOOKUP_PIECES = ('{"country"', ': "France"}')
USAGE = capture.USAGE


def lookup_capital(country: str) -> str:
    """The capital city of a country.

    Args:
        country: The country's name.
    """
    time.sleep(TOOL_S)
    return {"France": "Paris"}.get(country, "unknown")


# --- the stub ------------------------------------------------------------------------------------------------


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content or ""


def _dspy_chunks(body: dict[str, Any]) -> tuple[str, ...] | None:
    """DSPy ChatAdapter's reply to ``body`` as chunks, or None when it is no DSPy prompt."""
    users = [m for m in body.get("messages") or () if isinstance(m, dict) and m.get("role") == "user"]
    text = _text_of(users[-1]) if users else ""
    if "Respond with the corresponding output fields" not in text:
        return None
    fields = [f for f in re.findall(r"`\[\[ ## (\w+) ## \]\]`", text.split("Respond with")[-1]) if f != "completed"]
    observed = "observation_0" in text
    values = {
        **DSPY_VALUES,
        "next_thought": ("I", " have", " the", " answer.") if observed else ("I", " should", " look", " it", " up."),
        "next_tool_name": ("finish",) if observed else (TOOL,),
        "next_tool_args": ("{}",) if observed else LOOKUP_PIECES,
    }
    chunks: list[str] = []
    for i, name in enumerate(fields):
        chunks += [("\n\n" if i else "") + f"[[ ## {name}", " ## ]]\n", *values.get(name, ("ok",))]
    return (*chunks, "\n\n[[ ## completed", " ## ]]")


def _is_tool_result(message: dict[str, Any]) -> bool:
    """A ``tool`` message, or smolagents' way of giving a tool's result: a user message ``Observation:\n...``."""
    if message.get("role") == "tool":
        return True
    return message.get("role") == "user" and _text_of(message).startswith("Observation:")


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [(t.get("function") or {}).get("name") or t.get("name") or "" for t in body.get("tools") or ()]


class AgentStubHandler(capture_responses.ResponsesStubHandler):
    """Chat completions answered by what the request asks (the module's doc); the rest as capture_responses.py's."""

    disable_nagle_algorithm = True
    #: Every chat request: path, stream, tools offered, the reply's kind, server-side times (ns).
    log: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        received_ns = time.time_ns()
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.loads(raw or b"{}")
        if not self.path.endswith("/chat/completions"):
            self.log.append({"path": self.path, "received_ns": received_ns, "stream": bool(body.get("stream"))})
            self.rfile = io.BytesIO(raw)
            super().do_POST()
            return
        names = _tool_names(body)
        messages = body.get("messages") or []
        has_result = any(isinstance(m, dict) and _is_tool_result(m) for m in messages)
        lookup = next((n for n in names if TOOL in n), None)
        final = next((n for n in names if n == "final_answer"), None)
        rec: dict[str, Any] = {
            "path": self.path,
            "received_ns": received_ns,
            "stream": bool(body.get("stream")),
            "tools": names,
            "first_chunk_ns": None,
        }
        self.log.append(rec)
        self._rec = rec
        if lookup and not has_result:
            rec["reply"] = f"tool_call {lookup}"
            self._tool_call(body, lookup, LOOKUP_PIECES)
        elif final:
            rec["reply"] = "tool_call final_answer"
            self._tool_call(body, final, FINAL_ANSWER_PIECES)
        else:
            chunks = _dspy_chunks(body)
            rec["reply"] = "dspy" if chunks else "text"
            self._text(body, chunks or capture.CHUNKS)
        rec["done_ns"] = time.time_ns()

    def _first(self) -> None:
        if self._rec.get("first_chunk_ns") is None:
            self._rec["first_chunk_ns"] = time.time_ns()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def _end_stream(self, body: dict[str, Any], finish_reason: str) -> None:
        self._event(self._chunk(body, [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**self._chunk(body, []), "usage": USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _text(self, body: dict[str, Any], chunks: tuple[str, ...]) -> None:
        if not body.get("stream"):
            time.sleep(capture.NON_STREAM_DELAY_S)
            message = {"role": "assistant", "content": "".join(chunks), "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            self._first()
            self._json({**self._chunk(body, [choice]), "object": "chat.completion", "usage": USAGE})
            return
        self._start_stream()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(chunks):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            delta: dict[str, Any] = {"content": text}
            if i == 0:
                delta["role"] = "assistant"
            self._first()
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        self._end_stream(body, "stop")

    def _tool_call(self, body: dict[str, Any], name: str, pieces: tuple[str, ...]) -> None:
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        if not body.get("stream"):
            time.sleep(capture.NON_STREAM_DELAY_S)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": "".join(pieces)}}
            message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
            self._first()
            self._json({**self._chunk(body, [choice]), "object": "chat.completion", "usage": USAGE})
            return
        self._start_stream()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        call = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        delta: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
        self._first()
        self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        for piece in pieces:
            time.sleep(capture.CHUNK_GAP_S)
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        self._end_stream(body, "tool_calls")


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AgentStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


# --- what the caller saw -------------------------------------------------------------------------------------


class Seen:
    """When the caller saw what."""

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self.called_ns = time.time_ns()
        self.first_event_ns: int | None = None
        self.first_chunk_ns: int | None = None
        self.answered_ns: int | None = None

    def event(self, text: str | None = None) -> None:
        now = time.time_ns()
        if self.first_event_ns is None:
            self.first_event_ns = now
        if self.streaming and text and self.first_chunk_ns is None:
            self.first_chunk_ns = now

    def answered(self) -> None:
        if self.answered_ns is None:
            self.answered_ns = time.time_ns()

    def done(self, **extra: Any) -> dict[str, Any]:
        done_ns = time.time_ns()
        return {
            "called_ns": self.called_ns,
            "first_event_ns": self.first_event_ns if self.streaming else None,
            "first_chunk_ns": self.first_chunk_ns,
            "answered_ns": self.answered_ns or done_ns,
            "done_ns": done_ns,
            **extra,
        }


# --- DSPy ----------------------------------------------------------------------------------------------------


class DspyService:
    """A RAG service whose answer is a DSPy program (``Predict`` or ``ReAct``), async, streamed by ``streamify``."""

    def __init__(self, base_url: str, engine: str, mark: bool = False) -> None:
        import dspy

        self.mark = mark
        kwargs: dict[str, Any] = {} if engine == "auto" else {"engine": engine}
        self.lm = dspy.LM(
            f"openai/{capture.MODEL}", api_base=base_url, api_key="stub-key", cache=False, num_retries=0, **kwargs
        )
        dspy.configure(lm=self.lm)
        self.predict = dspy.Predict("question -> answer")
        self.react = dspy.ReAct("question -> answer", tools=[lookup_capital], max_iters=4)

    def backend(self) -> str:
        from dspy.clients.backend_selection import select_backend

        return repr(select_backend(self.lm))

    async def call(self, case: str) -> dict[str, Any]:
        import dspy
        from dspy.streaming import StreamListener, StreamResponse

        tool, streaming = case.startswith("tool_"), not case.endswith("non_stream")
        question = TOOL_QUESTION if tool else QUESTION
        seen, output, kinds = Seen(streaming), None, []
        if streaming:
            # a listener serves one stream (allow_reuse=False): a new one per request
            listener = StreamListener(signature_field_name="answer")
            program = dspy.streamify(self.react if tool else self.predict, stream_listeners=[listener])
            items = program(question=question)
            if self.mark:  # the service's line: ttft-emit marks the first StreamResponse with text
                from ttft_emit.otel_marks import first_token_marked

                items = first_token_marked(items)
            async for item in items:
                kinds.append(type(item).__name__)
                text = item.chunk if isinstance(item, StreamResponse) else None
                seen.event(text)
                if isinstance(item, dspy.Prediction):
                    seen.answered()
                    output = item.answer
        else:
            output = (await (self.react if tool else self.predict).acall(question=question)).answer
            seen.answered()
        assert output == ANSWER, output
        return seen.done(items=_runs(kinds))


def _runs(kinds: list[str]) -> list[str]:
    """``["A", "A", "B"]`` as ``["A x2", "B"]``: the kinds of item the caller's iteration gave, in order."""
    out: list[str] = []
    for kind in kinds:
        if out and out[-1].split(" x")[0] == kind:
            head, _, n = out[-1].partition(" x")
            out[-1] = f"{head} x{int(n or 1) + 1}"
        else:
            out.append(kind)
    return out


# --- smolagents ----------------------------------------------------------------------------------------------


class SmolagentsService:
    """A RAG service whose answer is a smolagents ``ToolCallingAgent`` run on ``OpenAIModel`` (the ``openai``
    client), streamed with ``stream_outputs=True`` and ``run(stream=True)``."""

    def __init__(self, base_url: str) -> None:
        from smolagents import OpenAIModel, ToolCallingAgent, tool
        from smolagents.monitoring import LogLevel

        self.model = OpenAIModel(model_id=capture.MODEL, api_base=base_url, api_key="stub-key")
        lookup = tool(lookup_capital)
        self.agents = {
            (tool_, streaming): ToolCallingAgent(
                tools=[lookup] if tool_ else [],
                model=self.model,
                stream_outputs=streaming,
                max_steps=4,
                verbosity_level=LogLevel.OFF,
            )
            for tool_ in (False, True)
            for streaming in (False, True)
        }

    async def call(self, case: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, case)  # smolagents is synchronous: a server's worker thread

    def _call(self, case: str) -> dict[str, Any]:
        from smolagents.memory import FinalAnswerStep
        from smolagents.models import ChatMessageStreamDelta

        tool, streaming = case.startswith("tool_"), not case.endswith("non_stream")
        agent = self.agents[tool, streaming]
        question = TOOL_QUESTION if tool else QUESTION
        seen, output, kinds = Seen(streaming), None, []
        if streaming:
            turn_text, in_turn, turn_first_delta_ns = "", False, []
            for event in agent.run(question, stream=True):
                kinds.append(type(event).__name__)
                if isinstance(event, ChatMessageStreamDelta):
                    if not in_turn:  # a model turn's first delta
                        in_turn, turn_text = True, ""
                        turn_first_delta_ns.append(time.time_ns())
                    turn_text += event.content or ""
                    turn_text += "".join((tc.function.arguments or "") for tc in event.tool_calls or () if tc.function)
                    # the answer's text is visible (the final_answer call's argument, or content)
                    seen.event(turn_text if capture.CHUNKS[0] in turn_text else None)
                else:
                    in_turn = False
                    seen.event(None)
                if isinstance(event, FinalAnswerStep):
                    seen.answered()
                    output = event.output
            extra = {"turn_first_delta_ns": turn_first_delta_ns}
        else:
            output = agent.run(question)
            seen.answered()
            extra = {}
        assert output == ANSWER, output
        return seen.done(items=_runs(kinds), **extra)


# --- CrewAI --------------------------------------------------------------------------------------------------


class CrewaiService:
    """A RAG service whose answer is a CrewAI crew of one agent and one task, its ``LLM("openai/gpt-4o-mini",
    base_url=<stub>)`` (CrewAI's native OpenAI provider, the ``openai`` client); streamed with ``stream=True`` on
    the LLM and on the crew (``kickoff`` then gives a ``CrewStreamingOutput`` to iterate)."""

    def __init__(self, base_url: str) -> None:
        from crewai import LLM
        from crewai.tools import tool

        self.llms = {
            s: LLM(model=f"openai/{capture.MODEL}", base_url=base_url, api_key="stub-key", stream=s)
            for s in (False, True)
        }
        self.lookup = tool(TOOL)(lookup_capital)

    def client(self, streaming: bool) -> Any:
        return self.llms[streaming]._get_sync_client()

    async def call(self, case: str) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, case)  # CrewAI's kickoff is synchronous

    def _call(self, case: str) -> dict[str, Any]:
        from crewai import Agent, Crew, Task

        tool, streaming = case.startswith("tool_"), not case.endswith("non_stream")
        agent = Agent(
            role="Geographer",
            goal="Answer questions about capitals" + ("; look facts up with your tools" if tool else ""),
            backstory="You know geography.",
            llm=self.llms[streaming],
            tools=[self.lookup] if tool else [],
            verbose=False,
        )
        task = Task(description="{question}", expected_output="A short sentence.", agent=agent)
        crew = Crew(agents=[agent], tasks=[task], verbose=False, stream=streaming)
        seen, kinds = Seen(streaming), []
        result = crew.kickoff(inputs={"question": TOOL_QUESTION if tool else QUESTION})
        if streaming:
            for chunk in result:
                kinds.append(f"{type(chunk).__name__}:{getattr(chunk.chunk_type, 'value', chunk.chunk_type)}")
                seen.event(chunk.content if getattr(chunk.chunk_type, "value", "") == "text" else None)
            result = result.result
        seen.answered()
        output = result.raw
        assert output == ANSWER, output
        return seen.done(items=_runs(kinds))


# --- the run -------------------------------------------------------------------------------------------------


async def ask(service: Any, tracer: Any, case: str) -> dict[str, Any]:
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
        with capture.retrieval_span(tracer, "openinference", QUESTION):
            await asyncio.sleep(RETRIEVAL_S)  # the vector search
        await asyncio.sleep(capture.PROMPT_WORK_S)
        seen = await service.call(case)
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": not case.endswith("non_stream"),
        "retrieval_attempts": 1,
        **seen,
    }


def _instrument(setup: str, provider: Any) -> None:
    import importlib

    spec = SETUPS[setup]
    for name in spec["instrumentors"]:
        _, module, cls = INSTRUMENTORS[name]
        kwargs = spec.get("instrument", {}) if name == setup.split("_", 1)[0] else {}
        getattr(importlib.import_module(module), cls)().instrument(tracer_provider=provider, **kwargs)


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    framework = setup.split("_", 1)[0]
    spec = SETUPS[setup]
    helper = spec.get("helper")
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the cost map at import
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")  # no .env loaded at import
    # CrewAI: no telemetry or trace upload (loopback only)
    os.environ.update(CREWAI_DISABLE_TELEMETRY="true", CREWAI_DISABLE_TRACKING="true", CREWAI_TRACING_ENABLED="false")
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # as Phoenix's register() does
    _instrument(setup, provider)
    server, base_url = serve()
    timing, extra = None, {}
    if framework == "dspy":
        if spec.get("mark"):
            sys.path.insert(0, str(EMITTER_SRC))
        service: Any = DspyService(base_url, spec["engine"], mark=bool(spec.get("mark")))
        extra["dspy_engine"] = spec["engine"]
        extra["dspy_backend"] = service.backend()
        clients = lambda: [importlib.import_module("litellm")]  # noqa: E731  DSPy calls the module's functions
    elif framework == "smolagents":
        service = SmolagentsService(base_url)
        clients = lambda: [service.model.client]  # noqa: E731  the model's openai client
    else:
        service = CrewaiService(base_url)
        clients = lambda: [service.client(s) for s in (False, True)]  # noqa: E731  each LLM's, built lazily
    if helper:  # the service's line, after the instrumentors
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        for client in clients():
            timing = time_first_chunk(client, tracer_provider=provider, fill_missing=helper == "fill")
    tracer = provider.get_tracer("rag-api")
    cases = CASES[framework]

    async def main() -> tuple[list[dict[str, Any]], Any]:
        for case in cases:  # warm-up, not written (outside any root span: their own traces, dropped below)
            await service.call(case)
        warm = asdict(timing.stats) if timing is not None else None
        AgentStubHandler.log.clear()
        truth = [await ask(service, tracer, case) for case in cases]
        await asyncio.sleep(0.3)  # spans that end after the caller's loop
        return truth, warm

    truth, warm = asyncio.run(main())
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    instrumentors = tuple(INSTRUMENTORS[name][0] for name in spec["instrumentors"])
    versions = {d: metadata.version(d) for d in (*DISTRIBUTIONS[framework], *instrumentors, *COMMON)}
    if spec.get("instrument"):
        extra["instrument"] = json.dumps(spec["instrument"])
    versions |= {k: str(v) for k, v in extra.items()}
    if helper or spec.get("mark"):
        versions["ttft-emit"] = metadata.version("ttft-emit")  # emitter/src's egg-info, on sys.path
    for t in truth:  # the stub's side of each request, for the eye
        end = t["done_ns"]
        t["stub"] = [r for r in AgentStubHandler.log if t["called_ns"] <= r["received_ns"] <= end]
    capture.write_capture(out, setup, spans, truth, versions, KEYS, timing=timing, warm=warm)
    for t in truth:
        r0 = min(s.start_time for s in spans if format(s.context.trace_id, "032x") == t["trace_id"] and not s.parent)
        print(f"# {t['case']} stub (ms from the root's start):", end="")
        for r in t["stub"]:
            first = r.get("first_chunk_ns")
            print(
                f" [{r.get('reply', r['path'])}{' stream' if r['stream'] else ''}"
                f" recv {(r['received_ns'] - r0) / 1e6:.1f}"
                f" first {(first - r0) / 1e6 if first else float('nan'):.1f}"
                f" done {(r.get('done_ns', r['received_ns']) - r0) / 1e6:.1f}]",
                end="",
            )
        print(f"\n#   caller items: {t.get('items')}")


def main() -> None:
    capture.setup_main(__file__, __doc__, tuple(SETUPS), run_setup, OUT, "", timeout_s=300)


if __name__ == "__main__":
    main()
