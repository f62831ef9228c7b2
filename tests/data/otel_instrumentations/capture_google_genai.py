"""Capture the spans that instrumentations of the Google Gen AI Python SDK (``google-genai``) export, against a
loopback stub of the Gemini API; write ``google_genai_<library>.otlp`` (4-byte big-endian length + one
ExportTraceServiceRequest per trace, ``capture.write_traces``) and ``google_genai_<library>.json`` (what the
client saw) beside this file, then print a span table.

The stub answers what ``genai.Client(api_key=..., http_options=types.HttpOptions(base_url=...))`` sends
(``google/genai/models.py``: ``{model}:generateContent`` and ``{model}:streamGenerateContent?alt=sse`` under
``/v1beta/models/``; ``_api_client.py`` strips ``data: `` from each SSE line and parses the rest as a
``GenerateContentResponse``): ``generateContent`` after :data:`capture.NON_STREAM_DELAY_S`, the stream's first
``data:`` event :data:`capture.FIRST_CHUNK_DELAY_S` after the request and the rest :data:`capture.CHUNK_GAP_S`
apart, ``usageMetadata`` (812 prompt tokens, 512 of them cached, 5 candidates tokens) in the last.

Three requests per library, each a trace: a root ``POST /ask`` (SERVER), a retrieval span of the library's
convention (OpenInference: ``openinference.span.kind = RETRIEVER``; otherwise ``gen_ai.operation.name =
retrieval``) around :data:`RETRIEVAL_S` of vector search, :data:`capture.PROMPT_WORK_S` of prompt work, then
the call:

1. ``stream``: ``client.models.generate_content_stream(...)`` iterated;
2. ``non_stream``: ``client.models.generate_content(...)``;
3. ``stream_async``: ``await client.aio.models.generate_content_stream(...)`` iterated with ``async for``.

Before them the client makes one call of each kind outside any request (the async one in the event loop of
``stream_async``), so the requests time a warm client as a running service's would; ``--cold`` skips it.

Libraries, each unmodified in its own process (``--library``; they patch the same ``Models`` class), with
their defaults (no content-capture or semantic-convention variable set):

- ``otel``: OpenTelemetry's ``opentelemetry-instrumentation-google-genai`` (``GoogleGenAiSdkInstrumentor``).
  It instruments only ``google-genai>=1.32.0,<3``: with google-genai 3.x installed, ``instrument()`` logs a
  dependency conflict and patches nothing (no LLM span at all), so requirements-google-genai.txt pins
  the newest 2.x, which the other two libraries accept as well;
- ``openinference``: ``openinference-instrumentation-google-genai`` (``GoogleGenAIInstrumentor``);
- ``openllmetry``: ``opentelemetry-instrumentation-google-generativeai`` (``GoogleGenerativeAiInstrumentor``;
  it instruments ``google-genai``).

    python3.11 -m venv /tmp/ggen
    /tmp/ggen/bin/pip install -r tests/data/otel_instrumentations/requirements-google-genai.txt
    /tmp/ggen/bin/python tests/data/otel_instrumentations/capture_google_genai.py

``--helper``: after the instrumentor is set up, the service's client is timed by ttft-emit's helper
(``time_first_chunk(client, tracer_provider=provider)``, from this repository's ``emitter/src``, put on
``sys.path``: nothing to install); writes ``google_genai_<library>_helper.otlp`` / ``.json``, the .json with
the helper's ``stats`` after the warm-up (``helper_stats_warm_up``) and at the end (``helper_stats``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # timing constants, write_traces

OUT = Path(__file__).resolve().parent
#: ttft-emit's sources (``--helper``), imported from the repository rather than installed.
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
#: Library name -> (distribution, module, instrumentor class).
LIBRARIES: dict[str, tuple[str, str, str]] = {
    "otel": (
        "opentelemetry-instrumentation-google-genai",
        "opentelemetry.instrumentation.google_genai",
        "GoogleGenAiSdkInstrumentor",
    ),
    "openinference": (
        "openinference-instrumentation-google-genai",
        "openinference.instrumentation.google_genai",
        "GoogleGenAIInstrumentor",
    ),
    "openllmetry": (
        "opentelemetry-instrumentation-google-generativeai",
        "opentelemetry.instrumentation.google_generativeai",
        "GoogleGenerativeAiInstrumentor",
    ),
}
#: Every distribution that shapes the spans, recorded per capture when installed.
DISTRIBUTIONS = (
    "google-genai",
    "httpx",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-instrumentation-google-genai",
    "opentelemetry-util-genai",
    "openinference-instrumentation-google-genai",
    "openinference-instrumentation",
    "openinference-semantic-conventions",
    "opentelemetry-instrumentation-google-generativeai",
    "opentelemetry-semantic-conventions-ai",
)
CASES = ("stream", "non_stream", "stream_async")
TENANT = "acme"
MODEL = "gemini-2.5-flash"
#: The vector search inside the retrieval span.
RETRIEVAL_S = 0.050
USAGE = {
    "promptTokenCount": 812,
    "cachedContentTokenCount": 512,
    "candidatesTokenCount": len(capture.CHUNKS),
    "totalTokenCount": 812 + len(capture.CHUNKS),
}
KEYS = ("first", "token", "stream", "operation", "time", "kind", "invocation", "chunk", "model")


class GeminiStubHandler(BaseHTTPRequestHandler):
    """``POST /v1beta/models/<model>:generateContent`` and ``…:streamGenerateContent?alt=sse``."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        path = self.path.split("?", 1)[0]
        model = path.rsplit("/", 1)[-1].split(":", 1)[0]
        if path.endswith(":streamGenerateContent"):
            self._stream(model)
        elif path.endswith(":generateContent"):
            time.sleep(capture.NON_STREAM_DELAY_S)
            raw = json.dumps(_response(model, "".join(capture.CHUNKS), last=True)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        else:
            self.send_error(404)

    def _stream(self, model: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            doc = _response(model, text, last=i == len(capture.CHUNKS) - 1)
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\r\n\r\n")
            self.wfile.flush()


def _response(model: str, text: str, last: bool) -> dict[str, Any]:
    """A ``GenerateContentResponse`` as the Gemini API spells it (camelCase)."""
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    doc: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": "stub-response"}
    if last:
        candidate["finishReason"] = "STOP"
        doc["usageMetadata"] = USAGE
    return doc


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), GeminiStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def versions() -> dict[str, str]:
    found = {}
    for name in DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


class GeminiRag:
    """``ask(case)`` is one request: root ``POST /ask``, the convention's retrieval span, the prompt work,
    then the google-genai call of ``case``; it returns what the client saw."""

    question = "What is the capital of France?"

    def __init__(self, library: str, provider: Any, base_url: str) -> None:
        from google import genai
        from google.genai import types

        self.library = library
        self.tracer = provider.get_tracer("rag-api")
        self.client = genai.Client(api_key="stub", http_options=types.HttpOptions(base_url=base_url))

    def _retrieve(self) -> None:
        with capture.retrieval_span(self.tracer, self.library, self.question):
            time.sleep(RETRIEVAL_S)

    def warm_up(self) -> None:
        """A streaming and a plain call outside any request (the instrumentation's LLM span of each is a trace
        of its own, not written): a process's first call pays for lazy imports and the client's set-up, which a
        running service's requests do not (``--cold`` skips this)."""
        for _ in self.client.models.generate_content_stream(model=MODEL, contents=self.question):
            pass
        self.client.models.generate_content(model=MODEL, contents=self.question)

    def ask(self, case: str, warm_up: bool = False) -> dict[str, Any]:
        if case == "stream_async":
            return asyncio.run(self._ask_async(case, warm_up))
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            self._retrieve()
            time.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            first_chunk_ns = None
            if case == "stream":
                for _ in self.client.models.generate_content_stream(model=MODEL, contents=self.question):
                    if first_chunk_ns is None:
                        first_chunk_ns = time.time_ns()
            else:
                self.client.models.generate_content(model=MODEL, contents=self.question)
            answered_ns = time.time_ns()
        return _truth(case, root, called_ns, first_chunk_ns, answered_ns)

    async def _ask_async(self, case: str, warm_up: bool) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        if warm_up:  # in the same event loop as the request
            async for _ in await self.client.aio.models.generate_content_stream(model=MODEL, contents=self.question):
                pass
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            self._retrieve()
            time.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            first_chunk_ns = None
            stream = await self.client.aio.models.generate_content_stream(model=MODEL, contents=self.question)
            async for _ in stream:
                if first_chunk_ns is None:
                    first_chunk_ns = time.time_ns()
            answered_ns = time.time_ns()
        return _truth(case, root, called_ns, first_chunk_ns, answered_ns)


def _truth(case: str, root: Any, called_ns: int, first_chunk_ns: int | None, answered_ns: int) -> dict[str, Any]:
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": case != "non_stream",
        "called_ns": called_ns,
        "first_chunk_ns": first_chunk_ns,
        "answered_ns": answered_ns,
    }


def run_library(library: str, out: Path, cold: bool = False, helper: bool = False) -> None:
    """One process: instrument, time the client with ttft-emit's helper (``helper``), warm the client up
    (unless ``cold``), run the three requests, write the two files and print the span table."""
    import importlib
    from dataclasses import asdict

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": f"rag-google-genai-{library}", "tenant.id": TENANT})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _, module, cls = LIBRARIES[library]
    getattr(importlib.import_module(module), cls)().instrument(tracer_provider=provider)

    server, base_url = serve()
    service = GeminiRag(library, provider, base_url)
    timing = None
    if helper:  # the service's one line, after the instrumentor is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(service.client, tracer_provider=provider)
    if not cold:
        service.warm_up()
    # (the async warm-up call runs in stream_async's event loop, so it is counted in the final stats only)
    warm_stats = asdict(timing.stats) if timing is not None else None
    truth = [service.ask(case, warm_up=not cold) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = f"google_genai_{library}" + ("_helper" if helper else "")
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc: dict[str, Any] = {"library": library, "versions": versions(), "tenant": TENANT, "warmed_up": not cold}
    if timing is not None:
        doc["helper"] = "ttft_emit.otel.time_first_chunk"
        doc["helper_stats_warm_up"] = warm_stats
        doc["helper_stats"] = asdict(timing.stats)
        print(f"# helper stats: after the sync warm-up {warm_stats}, at the end {doc['helper_stats']}")
    doc["traces"] = truth
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    capture.print_spans(spans, truth, KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), help="run one library (this process)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--cold", action="store_true", help="no warm-up call before the requests")
    parser.add_argument("--helper", action="store_true", help="time the client with ttft-emit's helper (*_helper.*)")
    args = parser.parse_args()
    if args.library:
        run_library(args.library, args.out, args.cold, args.helper)
        return
    suffix = "_helper" if args.helper else ""
    for library in LIBRARIES:  # one process each: the libraries patch the same Models class
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)]
        cmd += ["--cold"] * args.cold + ["--helper"] * args.helper
        subprocess.run(cmd, check=True, timeout=120)
        print(f"{library}: {args.out / ('google_genai_' + library + suffix + '.otlp')}")


if __name__ == "__main__":
    main()
