"""Capture the spans two Anthropic instrumentations and the ``anthropic`` SDK's own tracing export for the
``anthropic`` client against a loopback stub of the Messages API; write ``anthropic_<library>.otlp`` (4-byte
big-endian length + one ExportTraceServiceRequest per trace, capture.py's ``write_traces``) and
``anthropic_<library>.json`` (what the client saw) beside this file, then print a span table.

Libraries, each unmodified in its own process (the instrumentors patch the same client): ``openinference``
(openinference-instrumentation-anthropic) and ``openllmetry`` (opentelemetry-instrumentation-anthropic), each
with its ``AnthropicInstrumentor`` and our tracer provider; ``sdk``: no instrumentor, the SDK's built-in
tracing (``anthropic.lib._tracing``, scope ``com.anthropic.sdk.python``) given our tracer provider by the client
option ``open_telemetry={"tracer_provider": provider}``; ``sdk_openinference``: the SDK's tracing given it so and
OpenInference's ``AnthropicInstrumentor``, as a team that uses OpenInference gets once the SDK's spans reach its
provider (the SDK's tracing is on by default and uses the global provider when given none). The first two
libraries' clients get no option, and this script sets no global provider: no SDK spans there.
``openinference_helper`` and ``openllmetry_helper``: the instrumentor as in ``openinference`` / ``openllmetry``,
then ttft-emit's helper on the client (``time_first_chunk(client, tracer_provider=provider)``, the one change
docs/otlp-mapping.md asks for; ttft-emit from this repository's ``emitter/src``, put on ``sys.path``); their
json also holds the helper's counters (``first_chunk_helper``).

Three requests per library, each a trace with a
root span ``POST /ask`` (SERVER), a retrieval span of the library's convention (OpenInference kind
``RETRIEVER``, else ``gen_ai.operation.name = retrieval``) around :data:`RETRIEVAL_S` of vector search,
:data:`capture.PROMPT_WORK_S` of prompt work no library traces, then the call:

1. ``stream``: ``client.messages.create(..., stream=True)``, the events iterated;
2. ``stream_helper``: ``with client.messages.stream(...) as s: for text in s.text_stream``;
3. ``non_stream``: ``client.messages.create(...)``.

The stub (``POST /v1/messages``) answers a plain call after :data:`capture.NON_STREAM_DELAY_S`. A streaming
call gets what the API sends: the response headers with ``message_start`` (usage with ``output_tokens`` 1),
``content_block_start`` and ``ping`` :data:`MESSAGE_START_DELAY_S` after the request, the first
``content_block_delta`` (``text_delta``) :data:`capture.FIRST_CHUNK_DELAY_S` after it, the rest
:data:`capture.CHUNK_GAP_S` apart, then ``content_block_stop``, ``message_delta`` (stop reason and the
cumulative usage) and ``message_stop``. Usage: ``input_tokens`` 812, ``cache_read_input_tokens`` 512,
``output_tokens`` 5.

The json records per trace the client's wall time (ns) at the root span's start, just before the call, at the
first text delta it got (streaming) and when the call was done; and the versions.

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/anth
    /tmp/anth/bin/pip install -r tests/data/otel_instrumentations/requirements-anthropic.txt
    /tmp/anth/bin/python tests/data/otel_instrumentations/capture_anthropic.py
"""

from __future__ import annotations

import argparse
import dataclasses
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
import capture  # write_traces, the timing constants

OUT = Path(__file__).resolve().parent
#: Library name -> (distribution, module of its ``AnthropicInstrumentor``, distributions it brings).
LIBRARIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "openinference": (
        "openinference-instrumentation-anthropic",
        "openinference.instrumentation.anthropic",
        ("openinference-instrumentation", "openinference-semantic-conventions"),
    ),
    "openllmetry": (
        "opentelemetry-instrumentation-anthropic",
        "opentelemetry.instrumentation.anthropic",
        ("opentelemetry-semantic-conventions-ai",),
    ),
}
#: Library name -> the instrumentor of :data:`LIBRARIES` that runs beside the SDK's own tracing, or None for none.
SDK_LIBRARIES: dict[str, str | None] = {"sdk": None, "sdk_openinference": "openinference"}
#: Library name -> the instrumentor of :data:`LIBRARIES` that runs with ttft-emit's first-chunk helper on the client.
HELPER_LIBRARIES: dict[str, str] = {"openinference_helper": "openinference", "openllmetry_helper": "openllmetry"}
#: ttft-emit's source (its ``ttft_emit.otel`` needs only ``opentelemetry-sdk``).
EMITTER_SRC = Path(__file__).resolve().parents[3] / "emitter" / "src"
OTHER_DISTRIBUTIONS = (
    "anthropic",
    "httpx2",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-common",
)
CASES = ("stream", "stream_helper", "non_stream")
MODEL = "claude-sonnet-4-5"
MAX_TOKENS = 256
#: The response headers and the events before the first text delta (message_start, content_block_start, ping).
MESSAGE_START_DELAY_S = 0.060
#: The vector search inside the retrieval span.
RETRIEVAL_S = 0.050
USAGE = {"input_tokens": 812, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 512}
OUTPUT_TOKENS = len(capture.CHUNKS)
QUESTION = "What is the capital of France?"
KEYS = ("first", "token", "stream", "operation", "kind", "invocation", "time", "model")


class AnthropicStub(BaseHTTPRequestHandler):
    """``POST /v1/messages``, streaming (server-sent events) or not, with fixed delays."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        received = time.monotonic()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if not self.path.endswith("/v1/messages"):
            self.send_error(404)
        elif body.get("stream"):
            self._stream(body, received)
        else:
            time.sleep(capture.NON_STREAM_DELAY_S)
            message = self._message(body)
            message["content"] = [{"type": "text", "text": "".join(capture.CHUNKS)}]
            message["stop_reason"] = "end_turn"
            message["usage"] = {**USAGE, "output_tokens": OUTPUT_TOKENS}
            raw = json.dumps(message).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_stub01",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**USAGE, "output_tokens": 1},
        }

    def _stream(self, body: dict[str, Any], received: float) -> None:
        _sleep_until(received + MESSAGE_START_DELAY_S)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self._event("message_start", {"type": "message_start", "message": self._message(body)})
        block = {"type": "text", "text": ""}
        self._event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})
        self._event("ping", {"type": "ping"})
        _sleep_until(received + capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            delta = {"type": "text_delta", "text": text}
            self._event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
        usage = {**USAGE, "output_tokens": OUTPUT_TOKENS}
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        self._event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        self._event("message_stop", {"type": "message_stop"})

    def _event(self, name: str, doc: dict[str, Any]) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(doc)}\n\n".encode())
        self.wfile.flush()


def _sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), AnthropicStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def instrumentor(library: str) -> str | None:
    """The :data:`LIBRARIES` entry whose ``AnthropicInstrumentor`` ``library`` runs, or None (the SDK's alone)."""
    if library in HELPER_LIBRARIES:
        return HELPER_LIBRARIES[library]
    return SDK_LIBRARIES.get(library, library)


def versions(library: str) -> dict[str, str]:
    names: tuple[str, ...] = ()
    if (inst := instrumentor(library)) is not None:
        dist, _, extra = LIBRARIES[inst]
        names = (dist, *extra)
    found = {name: metadata.version(name) for name in (*names, *OTHER_DISTRIBUTIONS)}
    if library in HELPER_LIBRARIES:  # from the source tree, not installed
        import ttft_emit

        found["ttft-emit"] = ttft_emit.__version__
    return found


def ask(library: str, tracer: Any, client: Any, case: str) -> dict[str, Any]:
    """One request of ``case``; what the client saw."""
    from opentelemetry.trace import SpanKind

    messages: Any = [{"role": "user", "content": QUESTION}]
    first_chunk_ns = None
    with tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
        with capture.retrieval_span(tracer, instrumentor(library), QUESTION):
            time.sleep(RETRIEVAL_S)  # the vector search
        time.sleep(capture.PROMPT_WORK_S)
        called_ns = time.time_ns()
        if case == "stream":
            stream = client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=messages, stream=True)
            for event in stream:
                if first_chunk_ns is None and event.type == "content_block_delta" and event.delta.type == "text_delta":
                    first_chunk_ns = time.time_ns()
        elif case == "stream_helper":
            with client.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, messages=messages) as s:
                for _ in s.text_stream:
                    if first_chunk_ns is None:
                        first_chunk_ns = time.time_ns()
        else:
            client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=messages)
        answered_ns = time.time_ns()
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": case != "non_stream",
        "started_ns": root.start_time,
        "called_ns": called_ns,
        "first_chunk_ns": first_chunk_ns,
        "answered_ns": answered_ns,
    }


def run_library(library: str, out: Path) -> None:
    """One process: instrument, run the cases, write the capture and print the span table."""
    import importlib

    import anthropic
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": f"rag-anthropic-{library}", "tenant.id": capture.TENANT})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if (inst := instrumentor(library)) is not None:
        importlib.import_module(LIBRARIES[inst][1]).AnthropicInstrumentor().instrument(tracer_provider=provider)

    server, base_url = serve()
    options: dict[str, Any] = {}
    if library in SDK_LIBRARIES:  # the SDK's own spans, to our provider
        options["open_telemetry"] = {"tracer_provider": provider}
    client = anthropic.Anthropic(base_url=base_url, api_key="stub-key", max_retries=0, timeout=10.0, **options)
    helper = None
    if library in HELPER_LIBRARIES:  # the service's one line, after the instrumentor
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        helper = time_first_chunk(client, tracer_provider=provider)
    tracer = provider.get_tracer("rag-api")
    truth = [ask(library, tracer, client, case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = f"anthropic_{library}"
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc: dict[str, Any] = {"library": name, "versions": versions(library), "tenant": capture.TENANT, "traces": truth}
    if helper is not None:
        doc["first_chunk_helper"] = dataclasses.asdict(helper.stats)
        print(f"first_chunk_helper: {doc['first_chunk_helper']}")
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    capture.print_spans(spans, truth, KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    every = (*LIBRARIES, *SDK_LIBRARIES, *HELPER_LIBRARIES)
    parser.add_argument("--library", choices=sorted(every), help="run one library (this process)")
    parser.add_argument("--only", nargs="+", choices=sorted(every), help="run these libraries (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.library:
        run_library(args.library, args.out)
        return
    for library in args.only or every:  # one process each: the libraries patch the same client
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)]
        subprocess.run(cmd, check=True, timeout=120)
        print(f"{library}: {args.out / f'anthropic_{library}.otlp'}")


if __name__ == "__main__":
    main()
