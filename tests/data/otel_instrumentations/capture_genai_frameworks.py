"""Capture the spans that agent frameworks with their own OpenTelemetry tracing (GenAI semantic conventions) export
when they answer through an OpenAI-compatible model on a loopback stub, streaming and not; write
``genai_<set-up>.otlp`` (capture.py's ``write_traces``) and ``genai_<set-up>.json`` (what the caller saw) into
``--out``, then print a span table.

The stub is capture_tools.py's (:class:`capture_tools.ToolStubHandler`: capture.py's chat-completions stub, first
chunk :data:`capture.FIRST_CHUNK_DELAY_S` after the request, that answers a request offering ``tools`` and holding
no tool result yet with a call of ``lookup_capital``), the call named after the first tool offered
(:class:`NamedToolStubHandler`: Semantic Kernel offers ``<plugin>-<function>``). Nothing leaves loopback.

Set-ups, each in its own process:

- ``adk``: Google ADK (``google-adk``), its own tracing on the global tracer provider (scope ``gcp.vertex.agent``;
  ADK's default telemetry schema, v2 = GenAI semconv aligned: ``invoke_agent``, ``generate_content <model>``,
  ``execute_tool``, no ``call_llm`` span). The agent's model is ``LiteLlm(model="openai/gpt-4o-mini",
  api_base=<stub>)`` (LiteLLM's ``acompletion``); streaming is ``RunConfig(streaming_mode=StreamingMode.SSE)``;
- ``adk_helper``: the same with ttft-emit's helper on the module LiteLLM is called through,
  ``time_first_chunk(litellm, tracer_provider=provider)`` (from this repository's ``emitter/src``), applied before
  ADK's first model call (ADK copies ``litellm.acompletion`` into its module when it first calls it);
- ``adk_legacy``: ``adk`` under ``ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1``, ADK's legacy schema, with ``call_llm``
  spans;
- ``sk``: Microsoft Semantic Kernel (``semantic-kernel``), its GenAI diagnostics on
  (``SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS=true``), on the global tracer provider; the
  service is ``OpenAIChatCompletion(ai_model_id="gpt-4o-mini", async_client=AsyncOpenAI(base_url=<stub>))``,
  called with ``get_chat_message_content`` / ``get_streaming_chat_message_content``;
- ``sk_helper``: the same with ``time_first_chunk(async_client, tracer_provider=provider)``. Semantic Kernel checks
  ``isinstance(response, openai.AsyncStream)`` on what ``chat.completions.create`` returned (its usage store and its
  streaming path): the helper's ``TimedStream`` answers ``__class__`` with the wrapped stream's class, as wrapt's
  proxies do. Before it did (2026-12-06), every streamed call failed in the service (``ServiceResponseException``:
  ``'AsyncStream' object has no attribute 'usage'``); a failed call is recorded (``error`` in the json).

Cases (each request a trace: root span ``POST /ask`` (SERVER), a GenAI ``retrieval`` span (capture.py's
``retrieval_span``) around 50 ms of vector search, :data:`capture.PROMPT_WORK_S` of prompt work, then the
framework):

1. ``stream``: streaming (ADK: SSE; SK: the streaming method, its chunks iterated);
2. ``non_stream``: the same without streaming;
3. ``tool_stream``: one tool, ``lookup_capital`` (:data:`TOOL_S` of work), streamed: turn 1 is the stub's streamed
   tool call, then the tool, then turn 2 streams the answer. ADK: an agent with one ``FunctionTool``, SSE. SK: a
   ``Kernel`` with a plugin ``geo`` holding the tool as a ``kernel_function`` (offered as ``geo-lookup_capital``),
   ``FunctionChoiceBehavior.Auto()``, the streaming method given the kernel (SK's auto-invoke loop).

What the caller saw per trace (``genai_<set-up>.json``): ``called_ns`` (just before the framework is called),
``first_event_ns`` (the first item the caller's iteration gives), ``first_chunk_ns`` (the first item with
non-empty text, streaming only: with a tool, of the answer), ``answered_ns`` (ADK: the final response's event; SK:
the answer returned / the stream's end) and ``done_ns`` (the run's iteration ended). One warm-up run of each case
first, not written.

    /root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/gfw
    /tmp/gfw/bin/pip install -r requirements-genai-frameworks.txt
    /tmp/gfw/bin/python capture_genai_frameworks.py --out /tmp/gfw_out [--only adk sk ...]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the retrieval conventions, write_capture, print_spans
import capture_tools  # the stub that answers a tool call

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
SETUPS = ("adk", "adk_helper", "adk_legacy", "sk", "sk_helper")
ADK_CASES = ("stream", "non_stream", "tool_stream")
SK_CASES = ("stream", "non_stream", "tool_stream")
KEYS = ("gen_ai", "first", "token", "stream", "finish", "tool", "span.kind", "time", "llm_request.model")
COMMON = ("openai", "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common")
DISTRIBUTIONS = {"adk": ("google-adk", "google-genai", "litellm", *COMMON), "sk": ("semantic-kernel", *COMMON)}
TOOL_S = 0.030
QUESTION = "What is the capital of France?"
TOOL_QUESTION = "What is the capital of France? Look it up."
ANSWER = "".join(capture.CHUNKS)
LOOKED_UP = "Answer briefly; look facts up with your tools."


async def lookup_capital(country: str) -> str:
    """The capital city of a country.

    Args:
      country: The country's name.
    """
    await asyncio.sleep(TOOL_S)
    return {"France": "Paris"}.get(country, "unknown")


class NamedToolStubHandler(capture_tools.ToolStubHandler):
    """capture_tools.py's stub, its tool call named after the first tool the request offers."""

    def _named(self, body: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
        name = body["tools"][0]["function"]["name"]
        for choice in doc.get("choices") or ():
            message = choice.get("delta") or choice.get("message") or {}
            for call in message.get("tool_calls") or ():
                if (call.get("function") or {}).get("name"):
                    call["function"]["name"] = name
        return doc

    def _event(self, doc: dict[str, Any]) -> None:
        body = getattr(self, "_body", None)
        super()._event(self._named(body, doc) if body and body.get("tools") else doc)

    def _json(self, doc: dict[str, Any]) -> None:
        body = getattr(self, "_body", None)
        super()._json(self._named(body, doc) if body and body.get("tools") else doc)

    def _stream_tool_call(self, body: dict[str, Any]) -> None:
        self._body = body
        super()._stream_tool_call(body)

    def _tool_call(self, body: dict[str, Any]) -> None:
        self._body = body
        super()._tool_call(body)


def serve() -> tuple[Any, str]:
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), NamedToolStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class Seen:
    """When the caller saw what."""

    def __init__(self) -> None:
        self.called_ns = time.time_ns()
        self.first_event_ns: int | None = None
        self.first_chunk_ns: int | None = None
        self.answered_ns: int | None = None

    def see(self, text: str | None, streaming: bool) -> None:
        now = time.time_ns()
        if self.first_event_ns is None:
            self.first_event_ns = now
        if streaming and text and self.first_chunk_ns is None:
            self.first_chunk_ns = now

    def done(self) -> dict[str, Any]:
        done_ns = time.time_ns()
        return {
            "called_ns": self.called_ns,
            "first_event_ns": self.first_event_ns,
            "first_chunk_ns": self.first_chunk_ns,
            "answered_ns": self.answered_ns or done_ns,
            "done_ns": done_ns,
        }


class AdkService:
    """A RAG service whose answer is a Google ADK agent run (``Runner.run_async``) on a LiteLLM model."""

    def __init__(self, base_url: str) -> None:
        from google.adk.agents import LlmAgent
        from google.adk.models.lite_llm import LiteLlm
        from google.adk.runners import InMemoryRunner
        from google.adk.tools import FunctionTool

        model = LiteLlm(model=f"openai/{capture.MODEL}", api_base=base_url, api_key="stub-key")
        agent = LlmAgent(name="assistant", model=model, instruction="Answer briefly.")
        tools = [FunctionTool(lookup_capital)]
        tool_agent = LlmAgent(name="assistant", model=model, instruction=LOOKED_UP, tools=tools)
        self.runners = {
            False: InMemoryRunner(agent=agent, app_name="rag"),
            True: InMemoryRunner(agent=tool_agent, app_name="rag"),
        }

    async def call(self, case: str) -> dict[str, Any]:
        from google.adk.agents.run_config import RunConfig, StreamingMode
        from google.genai import types

        tool, streaming = case.startswith("tool_"), not case.endswith("non_stream")
        runner = self.runners[tool]
        session = await runner.session_service.create_session(app_name="rag", user_id="user")
        message = types.Content(role="user", parts=[types.Part(text=TOOL_QUESTION if tool else QUESTION)])
        config = RunConfig(streaming_mode=StreamingMode.SSE if streaming else StreamingMode.NONE)
        seen, output = Seen(), None
        async for event in runner.run_async(
            user_id="user", session_id=session.id, new_message=message, run_config=config
        ):
            parts = (event.content.parts or []) if event.content is not None else []
            text = "".join(p.text or "" for p in parts if not p.thought)
            seen.see(text, streaming)
            if event.is_final_response() and not event.partial and text:
                seen.answered_ns, output = time.time_ns(), text
        assert output == ANSWER, output
        return seen.done()


class SkService:
    """A RAG service whose answer is Semantic Kernel's ``OpenAIChatCompletion`` on a custom ``AsyncOpenAI``."""

    def __init__(self, base_url: str) -> None:
        from openai import AsyncOpenAI
        from semantic_kernel import Kernel
        from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion
        from semantic_kernel.functions import kernel_function

        self.client = AsyncOpenAI(base_url=base_url, api_key="stub-key", max_retries=0)
        self.service = OpenAIChatCompletion(ai_model_id=capture.MODEL, async_client=self.client)

        class Geo:
            @kernel_function(name="lookup_capital", description="The capital city of a country.")
            async def lookup_capital(self, country: str) -> str:
                return await lookup_capital(country)

        self.kernel = Kernel()
        self.kernel.add_service(self.service)
        self.kernel.add_plugin(Geo(), plugin_name="geo")

    async def call(self, case: str) -> dict[str, Any]:
        from semantic_kernel.connectors.ai import FunctionChoiceBehavior
        from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
        from semantic_kernel.contents import ChatHistory

        tool, streaming = case.startswith("tool_"), not case.endswith("non_stream")
        history = ChatHistory(system_message=LOOKED_UP if tool else "Answer briefly.")
        history.add_user_message(TOOL_QUESTION if tool else QUESTION)
        settings = OpenAIChatPromptExecutionSettings()
        extra: dict[str, Any] = {}
        if tool:
            settings.function_choice_behavior = FunctionChoiceBehavior.Auto()
            extra["kernel"] = self.kernel
        seen = Seen()
        try:
            if streaming:
                output = ""
                async for chunk in self.service.get_streaming_chat_message_content(history, settings, **extra):
                    text = str(chunk) if chunk is not None else ""
                    seen.see(text, True)
                    output += text
                seen.answered_ns = time.time_ns()
            else:
                result = await self.service.get_chat_message_content(history, settings)
                seen.answered_ns = time.time_ns()
                output = str(result)
                seen.see(output, False)
        except Exception as exc:  # recorded, not raised: the trace is written with the framework's error span
            print(f"# {case}: the call failed: {exc!r}", file=sys.stderr)
            return {**seen.done(), "error": repr(exc)}
        assert output == ANSWER, output
        return seen.done()


async def ask(service: Any, tracer: Any, case: str) -> dict[str, Any]:
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
        with capture.retrieval_span(tracer, "genai", QUESTION):
            await asyncio.sleep(0.050)  # the vector search
        await asyncio.sleep(capture.PROMPT_WORK_S)
        seen = await service.call(case)
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": not case.endswith("non_stream"),
        "retrieval_attempts": 1,
        **seen,
    }


async def _run(service: Any, tracer: Any, cases: tuple[str, ...], timing: Any) -> tuple[list[dict[str, Any]], Any]:
    for case in cases:  # warm-up, not written (outside any root span: their own traces, dropped below)
        await service.call(case)
    warm = asdict(timing.stats) if timing is not None else None
    return [await ask(service, tracer, case) for case in cases], warm


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    framework = "adk" if setup.startswith("adk") else "sk"
    helper = "_helper" in setup
    if setup == "adk_legacy":
        os.environ["ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN"] = "1"
    if framework == "adk":
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the cost map at import
        os.environ.setdefault("LITELLM_MODE", "PRODUCTION")  # no .env loaded at import
    else:
        os.environ["SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS"] = "true"
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # both frameworks trace on the global provider
    server, base_url = serve()
    timing = None
    if framework == "adk":
        if helper:  # before ADK's first model call: it copies litellm.acompletion then
            import litellm

            sys.path.insert(0, str(EMITTER_SRC))
            from ttft_emit.otel import time_first_chunk

            timing = time_first_chunk(litellm, tracer_provider=provider)
        service: Any = AdkService(base_url)
        cases = ADK_CASES
    else:
        service = SkService(base_url)
        if helper:
            sys.path.insert(0, str(EMITTER_SRC))
            from ttft_emit.otel import time_first_chunk

            timing = time_first_chunk(service.client, tracer_provider=provider)
        cases = SK_CASES
    tracer = provider.get_tracer("rag-api")

    async def main() -> tuple[list[dict[str, Any]], Any]:
        truth, warm = await _run(service, tracer, cases, timing)
        await asyncio.sleep(0.2)  # let spans that end after the caller's loop end
        return truth, warm

    truth, warm = asyncio.run(main())
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    versions = {d: metadata.version(d) for d in DISTRIBUTIONS[framework]}
    if helper:
        versions["ttft-emit"] = metadata.version("ttft-emit")  # emitter/src's egg-info, on sys.path
    if setup == "adk_legacy":
        versions["ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN"] = "1"
    capture.write_capture(out, f"genai_{setup}", spans, truth, versions, KEYS, timing=timing, warm=warm)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "genai_", timeout_s=300)


if __name__ == "__main__":
    main()
