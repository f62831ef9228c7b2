"""Capture the spans that instrumentations of the Groq and Mistral Python SDKs (``groq``, ``mistralai``) export
against loopback stubs; write ``<setup>.otlp`` (4-byte big-endian length + one ExportTraceServiceRequest per
trace, ``capture.write_traces``) and ``<setup>.json`` (what the client saw) in ``--out``, then print a span table.

Stubs (subclasses of capture.py's OpenAI-compatible ``StubHandler``; same delays: a plain call answered after
:data:`capture.NON_STREAM_DELAY_S`, a stream's response headers at once, its first ``data:`` chunk
:data:`capture.FIRST_CHUNK_DELAY_S` after the request, the rest :data:`capture.CHUNK_GAP_S` apart):

- Groq: the ``groq`` client posts to ``{base_url}/openai/v1/chat/completions`` (OpenAI's wire format). As Groq's
  API does, a stream's last chunk (the one with ``finish_reason``) carries the usage in ``x_groq.usage``; a
  separate ``usage`` chunk only with ``stream_options.include_usage`` (not asked here);
- Mistral: the ``mistralai`` client posts to ``{server_url}/v1/chat/completions`` (``stream: true`` for
  ``chat.stream``), reads ``data:`` events up to ``data: [DONE]`` (``eventstreaming.EventStream``, each event a
  ``CompletionEvent`` whose ``data`` is a ``CompletionChunk``). As Mistral's API does, the usage comes on the last
  chunk, with its ``finish_reason`` (Mistral sends no ``stream_options``).

Usage: 812 prompt tokens (``prompt_tokens_details.cached_tokens`` 512), 5 completion tokens.

Set-ups (``--setup``, one process each: the instrumentors patch the same classes), each with its own tracer
provider (``SimpleSpanProcessor`` into an ``InMemorySpanExporter``, resource ``tenant.id = acme``):

- ``groq_openinference``: ``openinference-instrumentation-groq`` (``GroqInstrumentor``);
- ``groq_openllmetry``: ``opentelemetry-instrumentation-groq`` (``GroqInstrumentor``);
- ``groq_openlit``: ``openlit.init`` (as capture_openlit_providers.py: our provider set globally first, metrics and
  events off, an empty local pricing file);
- ``mistral_openinference``: ``openinference-instrumentation-mistralai`` (``MistralAIInstrumentor``; mistralai >= 2:
  it patches ``mistralai.client.chat.Chat``);
- ``mistral_openllmetry``: ``opentelemetry-instrumentation-mistralai`` (``MistralAiInstrumentor``). 0.62.4 imports
  ``mistralai.models`` and patches ``mistralai.chat.Chat``: mistralai 1.x only (with 3.x its module does not
  import), so this set-up runs in a venv with mistralai 1.12.4;
- ``mistral_openlit``: ``openlit.init``; OpenLIT 1.45.0 patches ``mistralai.chat.Chat`` too: mistralai 1.12.4. That
  mistralai traces its own calls whenever a global tracer provider is set (scope ``mistralai_sdk_tracer``), and
  OpenLIT needs one: its spans are exported beside OpenLIT's;
- ``mistral_sdk``: no instrumentor, mistralai 3.x's own tracing given our provider
  (``mistralai.extra.observability.configure_telemetry(client, provider=provider)``; off by default: it needs that
  call or ``MISTRAL_SDK_TELEMETRY``, which this script removes from its environment, as its ``dedicated`` mode
  would export off the machine).

``<setup>_helper``: the same, then ttft-emit's helper on the service's clients
(``time_first_chunk(client, tracer_provider=provider)``, from this repository's ``emitter/src``);
``<setup>_helper_fill``: with ``fill_missing=True``; ``<setup>_wrap`` (Mistral): the helper's
``FirstChunkTiming.wrap`` on the Mistral client's ``chat.complete`` / ``chat.complete_async`` (never stream),
``chat.stream`` / ``chat.stream_async`` (always stream), which ``CLIENT_METHODS`` did not list before 2026-12-06
(now it does: the ``mistral_*_helper`` captures were made again after, and equal the ``_wrap`` ones);
``<setup>_wrap_fill``: the same after ``fill_missing_spans(provider)``. Their json has the helper's ``stats`` after
the warm-up and at the end, and the methods it wrapped (``helper_wrapped``).

Three requests per set-up, each a trace: a root ``POST /ask`` (SERVER), the retrieval span of the library's
convention (``capture.retrieval_span``: OpenInference kind ``RETRIEVER``, else ``gen_ai.operation.name =
retrieval``) around :data:`RETRIEVAL_S` of vector search, :data:`capture.PROMPT_WORK_S` of prompt work, then:

1. ``stream``: Groq ``client.chat.completions.create(..., stream=True)`` / Mistral ``client.chat.stream(...)``,
   iterated;
2. ``non_stream``: Groq ``client.chat.completions.create(...)`` / Mistral ``client.chat.complete(...)``;
3. ``stream_async``: Groq ``await AsyncGroq().chat.completions.create(..., stream=True)`` / Mistral
   ``await client.chat.stream_async(...)``, iterated with ``async for``.

Before them the clients make one call of each kind outside any request (the async one in ``stream_async``'s event
loop), as a running service's would have. The json records per trace the case, trace id, streaming or not, the
client's wall time (ns) just before the call, at the first chunk with content (streaming) and when the call was done.

Venvs (requirements-more-providers.txt, pinned as captured):

    # groq_*openinference*, groq_*openllmetry*, mistral_openinference*, mistral_sdk*:
    python3.11 -m venv /tmp/moreprov
    /tmp/moreprov/bin/pip install -r tests/data/otel_instrumentations/requirements-more-providers.txt
    python3.11 -m venv /tmp/moreprov_m1     # mistral_openllmetry* (mistralai 1.x)
    python3.11 -m venv /tmp/moreprov_olit   # groq_openlit*, mistral_openlit* (openlit, mistralai 1.x)
    (their pins: the commented blocks of requirements-more-providers.txt)

    /tmp/moreprov/bin/python tests/data/otel_instrumentations/capture_more_providers.py --out /tmp/moreprov_out \\
        --python mistral_openllmetry=/tmp/moreprov_m1/bin/python --python openlit=/tmp/moreprov_olit/bin/python
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # StubHandler, write_capture, retrieval_span, the timing constants

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
GROQ_MODEL = "llama-3.3-70b-versatile"
MISTRAL_MODEL = "mistral-small-latest"
RETRIEVAL_S = 0.050
QUESTION = "What is the capital of France?"
CASES = ("stream", "non_stream", "stream_async")
KEYS = ("first", "token", "stream", "operation", "kind", "invocation", "time", "model", "usage", "provider", "system")
#: Library -> (instrumentor module, class); ``openlit`` and ``sdk`` are set up otherwise.
INSTRUMENTORS: dict[tuple[str, str], tuple[str, str]] = {
    ("groq", "openinference"): ("openinference.instrumentation.groq", "GroqInstrumentor"),
    ("groq", "openllmetry"): ("opentelemetry.instrumentation.groq", "GroqInstrumentor"),
    ("mistral", "openinference"): ("openinference.instrumentation.mistralai", "MistralAIInstrumentor"),
    ("mistral", "openllmetry"): ("opentelemetry.instrumentation.mistralai", "MistralAiInstrumentor"),
}
BASE_SETUPS = (
    "groq_openinference",
    "groq_openllmetry",
    "groq_openlit",
    "mistral_openinference",
    "mistral_openllmetry",
    "mistral_openlit",
    "mistral_sdk",
)
SUFFIXES = {"groq": ("", "_helper", "_helper_fill"), "mistral": ("", "_helper", "_wrap", "_wrap_fill")}
SETUPS = tuple(f"{base}{suffix}" for base in BASE_SETUPS for suffix in SUFFIXES[base.split("_", 1)[0]])
DISTRIBUTIONS = (
    "groq",
    "mistralai",
    "httpx",
    "httpx2",
    "openinference-instrumentation-groq",
    "openinference-instrumentation-mistralai",
    "openinference-instrumentation",
    "openinference-semantic-conventions",
    "opentelemetry-instrumentation-groq",
    "opentelemetry-instrumentation-mistralai",
    "opentelemetry-semantic-conventions-ai",
    "openlit",
    "opentelemetry-instrumentation-httpx",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-common",
    "wrapt",
)


def parse_setup(setup: str) -> tuple[str, str, str]:
    """``setup`` -> (provider, library, helper mode: ``""``, ``helper``, ``helper_fill``, ``wrap`` or ``wrap_fill``)."""
    provider, rest = setup.split("_", 1)
    for mode in ("_helper_fill", "_wrap_fill", "_helper", "_wrap"):
        if rest.endswith(mode):
            return provider, rest[: -len(mode)], mode[1:]
    return provider, rest, ""


# --- the stubs -------------------------------------------------------------------------------------------------


class GroqStub(capture.StubHandler):
    """capture.py's stub; a stream's finishing chunk carries ``x_groq.usage`` (Groq's API)."""

    def _stream(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            delta: dict[str, Any] = {"content": text}
            if i == 0:
                delta["role"] = "assistant"
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "finish_reason": None}]))
        last = self._chunk(body, [{"index": 0, "delta": {}, "finish_reason": "stop"}])
        last["x_groq"] = {"id": "req_stub", "usage": capture.USAGE}
        self._event(last)
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**self._chunk(body, []), "usage": capture.USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class MistralStub(capture.StubHandler):
    """capture.py's stub; a stream's finishing chunk carries ``usage`` (Mistral's API), no separate usage chunk."""

    def _stream(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            delta: dict[str, Any] = {"content": text}
            if i == 0:
                delta["role"] = "assistant"
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "finish_reason": None}]))
        self._event({**self._chunk(body, [{"index": 0, "delta": {}, "finish_reason": "stop"}]), "usage": capture.USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def serve(handler: type) -> tuple[ThreadingHTTPServer, str]:
    import threading

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# --- the services -----------------------------------------------------------------------------------------------


def _truth(case: str, root: Any, called_ns: int, first_chunk_ns: int | None, answered_ns: int) -> dict[str, Any]:
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": case != "non_stream",
        "called_ns": called_ns,
        "first_chunk_ns": first_chunk_ns,
        "answered_ns": answered_ns,
    }


class Rag:
    """``ask(case)``: root ``POST /ask``, the convention's retrieval span, the prompt work, then the provider's call."""

    def __init__(self, convention: str, provider: Any) -> None:
        self.convention = convention
        self.tracer = provider.get_tracer("rag-api")

    # the provider's three calls: subclasses
    def call_stream(self) -> Any: ...
    def call_plain(self) -> Any: ...
    async def call_stream_async(self) -> Any: ...
    @staticmethod
    def text(chunk: Any) -> str | None: ...

    def warm_up(self) -> None:
        for _ in self.call_stream():
            pass
        self.call_plain()

    def ask(self, case: str) -> dict[str, Any]:
        if case == "stream_async":
            return asyncio.run(self._ask_async(case))
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with capture.retrieval_span(self.tracer, self.convention, QUESTION):
                time.sleep(RETRIEVAL_S)
            time.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            first_chunk_ns = None
            if case == "stream":
                for chunk in self.call_stream():
                    if first_chunk_ns is None and self.text(chunk):
                        first_chunk_ns = time.time_ns()
            else:
                self.call_plain()
            answered_ns = time.time_ns()
        return _truth(case, root, called_ns, first_chunk_ns, answered_ns)

    async def _ask_async(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        async for _ in await self.call_stream_async():  # the warm-up, in this event loop
            pass
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with capture.retrieval_span(self.tracer, self.convention, QUESTION):
                time.sleep(RETRIEVAL_S)
            time.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            first_chunk_ns = None
            async for chunk in await self.call_stream_async():
                if first_chunk_ns is None and self.text(chunk):
                    first_chunk_ns = time.time_ns()
            answered_ns = time.time_ns()
        return _truth(case, root, called_ns, first_chunk_ns, answered_ns)


class GroqRag(Rag):
    def __init__(self, convention: str, provider: Any, base_url: str) -> None:
        import groq

        super().__init__(convention, provider)
        self.client = groq.Groq(base_url=base_url, api_key="stub-key", max_retries=0, timeout=10.0)
        self.aclient = groq.AsyncGroq(base_url=base_url, api_key="stub-key", max_retries=0, timeout=10.0)

    def clients(self) -> list[Any]:
        return [self.client, self.aclient]

    def _messages(self) -> Any:
        return [{"role": "user", "content": QUESTION}]

    def call_stream(self) -> Any:
        return self.client.chat.completions.create(model=GROQ_MODEL, messages=self._messages(), stream=True)

    def call_plain(self) -> Any:
        return self.client.chat.completions.create(model=GROQ_MODEL, messages=self._messages())

    async def call_stream_async(self) -> Any:
        return await self.aclient.chat.completions.create(model=GROQ_MODEL, messages=self._messages(), stream=True)

    @staticmethod
    def text(chunk: Any) -> str | None:
        return chunk.choices[0].delta.content if chunk.choices else None


def mistral_class() -> Any:
    try:  # mistralai 1.x
        from mistralai import Mistral
    except ImportError:  # mistralai >= 2: a namespace package
        from mistralai.client import Mistral
    return Mistral


class MistralRag(Rag):
    def __init__(self, convention: str, provider: Any, server_url: str) -> None:
        super().__init__(convention, provider)
        self.client = mistral_class()(api_key="stub-key", server_url=server_url, timeout_ms=10_000)

    def clients(self) -> list[Any]:
        return [self.client]

    def _messages(self) -> Any:
        return [{"role": "user", "content": QUESTION}]

    def call_stream(self) -> Any:
        return self.client.chat.stream(model=MISTRAL_MODEL, messages=self._messages())

    def call_plain(self) -> Any:
        return self.client.chat.complete(model=MISTRAL_MODEL, messages=self._messages())

    async def call_stream_async(self) -> Any:
        return await self.client.chat.stream_async(model=MISTRAL_MODEL, messages=self._messages())

    @staticmethod
    def text(event: Any) -> str | None:
        data = getattr(event, "data", event)
        return data.choices[0].delta.content if data.choices else None


# --- set-up -----------------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    found = {}
    for name in DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def tracer_provider(setup: str, global_: bool) -> tuple[Any, Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": f"rag-{setup}", "tenant.id": capture.TENANT})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if global_:
        trace.set_tracer_provider(provider)
    return provider, exporter


def openlit_init(service: str) -> None:
    """As capture_openlit_providers.py: no metrics, no events, a local empty pricing file (no fetch)."""
    import openlit

    pricing = Path(tempfile.mkdtemp(prefix="openlit-")) / "pricing.json"
    pricing.write_text("{}")
    openlit.init(service_name=service, disable_metrics=True, disable_events=True, pricing_json=str(pricing))


def wrap_mistral(timing: Any, client: Any) -> list[str]:
    """The helper's ``FirstChunkTiming.wrap`` on the Mistral client's chat methods (not in ``CLIENT_METHODS``)."""
    wrapped = []
    for name, streams in (("complete", False), ("stream", True), ("complete_async", False), ("stream_async", True)):
        method = getattr(client.chat, name)
        setattr(client.chat, name, timing.wrap(method, streams))
        wrapped.append(f"chat.{name} (stream={streams})")
    return wrapped


def run_setup(setup: str, out: Path) -> None:
    import importlib

    os.environ.pop("MISTRAL_SDK_TELEMETRY", None)  # its "dedicated" mode exports off the machine
    provider_name, library, mode = parse_setup(setup)
    # OpenLIT reuses the global provider; so does mistralai 1.x's own tracing (then on) beside it.
    provider, exporter = tracer_provider(setup, global_=library == "openlit")
    if library == "openlit":
        openlit_init(f"rag-{setup}")
    elif library != "sdk":
        module, cls = INSTRUMENTORS[(provider_name, library)]
        getattr(importlib.import_module(module), cls)().instrument(tracer_provider=provider)

    convention = "openinference" if library == "openinference" else "genai"
    if provider_name == "groq":
        server, base_url = serve(GroqStub)
        service: Rag = GroqRag(convention, provider, base_url)
    else:
        server, base_url = serve(MistralStub)
        service = MistralRag(convention, provider, base_url)
    if library == "sdk":
        from mistralai.extra.observability import configure_telemetry

        configure_telemetry(service.client, provider=provider)

    timing = None
    extra: dict[str, Any] = {}
    if mode:  # the service's change, after the instrumentor is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import CLIENT_METHODS, FirstChunkTiming, time_first_chunk

        if mode.startswith("wrap"):
            timing = FirstChunkTiming()
            provider.add_span_processor(timing.span_processor())
            if mode == "wrap_fill":
                timing.fill_missing_spans(provider)
            extra["helper_wrapped"] = wrap_mistral(timing, service.client)
            extra["helper_fill_missing"] = mode == "wrap_fill"
        else:
            for client in service.clients():
                timing = time_first_chunk(client, tracer_provider=provider, fill_missing=mode == "helper_fill")
            wrapped = []
            for client in service.clients():
                for path, _ in CLIENT_METHODS:
                    obj: Any = client
                    for part in path:
                        obj = getattr(obj, part, None)
                    if getattr(obj, "_ttft_first_chunk", False):
                        wrapped.append(f"{type(client).__name__}." + ".".join(path))
            extra["helper_wrapped"] = wrapped
            extra["helper_fill_missing"] = mode == "helper_fill"
        print(f"# helper wraps: {extra['helper_wrapped']}")
    service.warm_up()
    warm = asdict(timing.stats) if timing is not None else None
    truth = [service.ask(case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    capture.write_capture(out, setup, spans, truth, versions(), KEYS, timing=timing, warm=warm)
    if extra:
        path = out / f"{setup}.json"
        doc = json.loads(path.read_text())
        doc.update(extra)
        path.write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    """capture.py's ``setup_main``: ``--python KEY=PATH`` picks the interpreter by the set-up's name or library."""
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "", python_keys=lambda s: (s, parse_setup(s)[1]))


if __name__ == "__main__":
    main()
