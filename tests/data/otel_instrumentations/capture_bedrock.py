"""Capture the spans that real instrumentations of AWS Bedrock (boto3's ``bedrock-runtime``) export.

The pattern of capture.py: a loopback stub with fixed delays, a RAG service whose request is a trace with a
root span ``POST /ask`` (SERVER), a retrieval span of the library's convention (OpenInference kind
``RETRIEVER``, else ``gen_ai.operation.name = retrieval``) around :data:`RETRIEVAL_S` of vector search,
:data:`capture.PROMPT_WORK_S` of prompt work no library traces, then the Bedrock call, made with an
unmodified ``boto3`` client pointed at the stub with ``endpoint_url`` (fake credentials from the
environment, see :func:`main`). Libraries, each in its own process (they patch the same client):

- ``otel``: OpenTelemetry's ``opentelemetry-instrumentation-botocore`` (its Bedrock extension sets GenAI
  attributes; it reads no semantic-convention opt-in variable at 0.66b2, only
  ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``, left unset);
- ``openinference``: ``openinference-instrumentation-bedrock``;
- ``openllmetry``: ``opentelemetry-instrumentation-bedrock``.

Cases, one trace each:

1. ``converse_stream``: ``client.converse_stream(...)``, the events of ``response["stream"]`` iterated;
2. ``converse``: ``client.converse(...)``;
3. ``invoke_stream``: ``client.invoke_model_with_response_stream(...)`` with an Anthropic Messages body, the
   chunks of ``response["body"]`` iterated.

The stub (``POST /model/<modelId>/converse``, ``/converse-stream``, ``/invoke-with-response-stream``)
answers ``converse`` after :data:`capture.NON_STREAM_DELAY_S`. A streaming call gets the response headers
(``application/vnd.amazon.eventstream``, HTTP/1.1 chunked, one event-stream message per HTTP chunk) and its
first event at once (``messageStart``; for ``invoke_stream`` the Anthropic ``message_start`` and
``content_block_start``), the first text delta :data:`capture.FIRST_CHUNK_DELAY_S` after the request, the
rest :data:`capture.CHUNK_GAP_S` apart, then the block stop, the message stop and the usage (Converse:
``metadata`` with ``inputTokens`` 812, ``cacheReadInputTokens`` 512, ``outputTokens`` 5; Anthropic:
``message_delta`` with the usage, ``message_stop`` with ``amazon-bedrock-invocationMetrics``).

The json records per trace the client's wall time (ns) at the root span's start, just before the call, at the
first text delta it got (streaming) and when the call was done; and the versions.

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/bedr
    /tmp/bedr/bin/pip install -r tests/data/otel_instrumentations/requirements-bedrock.txt
    /tmp/bedr/bin/python tests/data/otel_instrumentations/capture_bedrock.py

``--helper``: after the instrumentor is set up, the service's client is timed by ttft-emit's helper
(``time_first_chunk(client, tracer_provider=provider)``, from this repository's ``emitter/src``, put on
``sys.path``: nothing to install); writes bedrock_<library>_helper.otlp / .json, the .json with the helper's
``stats`` at the end (``helper_stats``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import struct
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
#: ttft-emit's sources (``--helper``), imported from the repository rather than installed.
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
#: Library name -> (distribution, module, class of its instrumentor, distributions it brings).
LIBRARIES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "otel": (
        "opentelemetry-instrumentation-botocore",
        "opentelemetry.instrumentation.botocore",
        "BotocoreInstrumentor",
        ("opentelemetry-propagator-aws-xray",),
    ),
    "openinference": (
        "openinference-instrumentation-bedrock",
        "openinference.instrumentation.bedrock",
        "BedrockInstrumentor",
        ("openinference-instrumentation", "openinference-semantic-conventions"),
    ),
    "openllmetry": (
        "opentelemetry-instrumentation-bedrock",
        "opentelemetry.instrumentation.bedrock",
        "BedrockInstrumentor",
        ("opentelemetry-semantic-conventions-ai",),
    ),
}
OTHER_DISTRIBUTIONS = (
    "boto3",
    "botocore",
    "urllib3",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-common",
)
CASES = ("converse_stream", "converse", "invoke_stream")
MODEL_ID = "anthropic.claude-3-5-haiku-20241022-v1:0"
ANTHROPIC_MODEL = "claude-3-5-haiku-20241022"
MAX_TOKENS = 256
#: The vector search inside the retrieval span.
RETRIEVAL_S = 0.050
INPUT_TOKENS = 812
CACHE_READ_TOKENS = 512
OUTPUT_TOKENS = len(capture.CHUNKS)
QUESTION = "What is the capital of France?"
KEYS = ("first", "token", "stream", "operation", "kind", "invocation", "time", "model", "usage")


# --- the event-stream encoding (botocore/eventstream.py reads it) -----------------------------------------


def _header(name: str, value: str) -> bytes:
    """One header: name length (1 byte), name, type 7 (string), value length (2 bytes), value."""
    raw_name, raw_value = name.encode(), value.encode()
    return struct.pack(">B", len(raw_name)) + raw_name + struct.pack(">BH", 7, len(raw_value)) + raw_value


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """An ``application/vnd.amazon.eventstream`` message: prelude (total length, headers length, CRC32 of
    those 8 bytes), headers, payload, CRC32 of all before it."""
    headers = (
        _header(":event-type", event_type)
        + _header(":content-type", "application/json")
        + _header(":message-type", "event")
    )
    body = json.dumps(payload, separators=(",", ":")).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + headers + body
    return message + struct.pack(">I", binascii.crc32(message) & 0xFFFFFFFF)


def _chunk(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An InvokeModelWithResponseStream ``chunk``: the model's event as base64 JSON in ``bytes``."""
    return "chunk", {"bytes": base64.b64encode(json.dumps(doc).encode()).decode()}


# --- the stub -----------------------------------------------------------------------------------------------


class BedrockStub(BaseHTTPRequestHandler):
    """``POST /model/<modelId>/converse``, ``/converse-stream`` and ``/invoke-with-response-stream``."""

    protocol_version = "HTTP/1.1"  # chunked, as Bedrock streams: urllib3 hands each chunk on as it comes

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        received = time.monotonic()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path.endswith("/converse"):
            time.sleep(capture.NON_STREAM_DELAY_S)
            self._json(
                {
                    "output": {"message": {"role": "assistant", "content": [{"text": "".join(capture.CHUNKS)}]}},
                    "stopReason": "end_turn",
                    "usage": _converse_usage(),
                    "metrics": {"latencyMs": int(capture.NON_STREAM_DELAY_S * 1000)},
                }
            )
        elif self.path.endswith("/converse-stream"):
            self._stream(self._converse_events(received), received)
        elif self.path.endswith("/invoke-with-response-stream"):
            self._stream(self._anthropic_events(body, received), received)
        else:
            self.send_error(404)

    def _json(self, doc: dict[str, Any]) -> None:
        raw = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("x-amzn-RequestId", "00000000-0000-4000-8000-000000000001")
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self, events: Any, received: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.amazon.eventstream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-amzn-RequestId", "00000000-0000-4000-8000-000000000002")
        self.send_header("X-Amzn-Bedrock-Content-Type", "application/json")
        self.end_headers()
        for event_type, payload in events:  # the generator sleeps between them
            raw = event_message(event_type, payload)
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    @staticmethod
    def _deltas(received: float) -> Any:
        """The chunks' texts, the first at FIRST_CHUNK_DELAY_S after the request, the rest CHUNK_GAP_S apart."""
        _sleep_until(received + capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            yield text

    def _converse_events(self, received: float) -> Any:
        yield "messageStart", {"role": "assistant"}
        for text in self._deltas(received):
            yield "contentBlockDelta", {"delta": {"text": text}, "contentBlockIndex": 0}
        yield "contentBlockStop", {"contentBlockIndex": 0}
        yield "messageStop", {"stopReason": "end_turn"}
        latency = int((time.monotonic() - received) * 1000)
        yield "metadata", {"usage": _converse_usage(), "metrics": {"latencyMs": latency}}

    def _anthropic_events(self, body: dict[str, Any], received: float) -> Any:
        usage = {"input_tokens": INPUT_TOKENS, "cache_creation_input_tokens": 0}
        usage["cache_read_input_tokens"] = CACHE_READ_TOKENS
        message = {
            "id": "msg_bdrk_stub01",
            "type": "message",
            "role": "assistant",
            "model": ANTHROPIC_MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        }
        yield _chunk({"type": "message_start", "message": message})
        block = {"type": "text", "text": ""}
        yield _chunk({"type": "content_block_start", "index": 0, "content_block": block})
        for text in self._deltas(received):
            delta = {"type": "text_delta", "text": text}
            yield _chunk({"type": "content_block_delta", "index": 0, "delta": delta})
        yield _chunk({"type": "content_block_stop", "index": 0})
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        yield _chunk({"type": "message_delta", "delta": delta, "usage": {"output_tokens": OUTPUT_TOKENS}})
        metrics = {
            "inputTokenCount": INPUT_TOKENS,
            "outputTokenCount": OUTPUT_TOKENS,
            "invocationLatency": int((time.monotonic() - received) * 1000),
            "firstByteLatency": int(capture.FIRST_CHUNK_DELAY_S * 1000),
            "cacheReadInputTokenCount": CACHE_READ_TOKENS,
            "cacheWriteInputTokenCount": 0,
        }
        yield _chunk({"type": "message_stop", "amazon-bedrock-invocationMetrics": metrics})


def _converse_usage() -> dict[str, int]:
    return {
        "inputTokens": INPUT_TOKENS,
        "outputTokens": OUTPUT_TOKENS,
        "totalTokens": INPUT_TOKENS + CACHE_READ_TOKENS + OUTPUT_TOKENS,
        "cacheReadInputTokens": CACHE_READ_TOKENS,
        "cacheWriteInputTokens": 0,
    }


def _sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BedrockStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# --- the service --------------------------------------------------------------------------------------------


def versions(library: str) -> dict[str, str]:
    dist, _, _, extra = LIBRARIES[library]
    return {name: metadata.version(name) for name in (dist, *extra, *OTHER_DISTRIBUTIONS)}


def ask(library: str, tracer: Any, client: Any, case: str) -> dict[str, Any]:
    """One request of ``case``; what the client saw."""
    from opentelemetry.trace import SpanKind

    messages = [{"role": "user", "content": [{"text": QUESTION}]}]
    config = {"maxTokens": MAX_TOKENS}
    first_chunk_ns = None
    with tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
        with capture.retrieval_span(tracer, library, QUESTION):
            time.sleep(RETRIEVAL_S)  # the vector search
        time.sleep(capture.PROMPT_WORK_S)
        called_ns = time.time_ns()
        if case == "converse_stream":
            response = client.converse_stream(modelId=MODEL_ID, messages=messages, inferenceConfig=config)
            for event in response["stream"]:
                if first_chunk_ns is None and "text" in event.get("contentBlockDelta", {}).get("delta", {}):
                    first_chunk_ns = time.time_ns()
        elif case == "converse":
            client.converse(modelId=MODEL_ID, messages=messages, inferenceConfig=config)
        else:
            request = {
                "anthropic_version": "bedrock-2023-05-31",
                "max_tokens": MAX_TOKENS,
                "messages": [{"role": "user", "content": QUESTION}],
            }
            response = client.invoke_model_with_response_stream(
                modelId=MODEL_ID, body=json.dumps(request), contentType="application/json", accept="application/json"
            )
            for event in response["body"]:
                doc = json.loads(event["chunk"]["bytes"]) if "chunk" in event else {}
                delta = doc.get("delta", {}) if doc.get("type") == "content_block_delta" else {}
                if first_chunk_ns is None and delta.get("type") == "text_delta":
                    first_chunk_ns = time.time_ns()
        answered_ns = time.time_ns()
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": case != "converse",
        "started_ns": root.start_time,
        "called_ns": called_ns,
        "first_chunk_ns": first_chunk_ns,
        "answered_ns": answered_ns,
    }


def run_library(library: str, out: Path, helper: bool = False) -> None:
    """One process: instrument, run the cases, write the capture and print the span table."""
    import importlib
    from dataclasses import asdict

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": f"rag-bedrock-{library}", "tenant.id": capture.TENANT})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _, module, cls, _ = LIBRARIES[library]
    # before the client is made: OpenInference and OpenLLMetry wrap the methods of each new client
    getattr(importlib.import_module(module), cls)().instrument(tracer_provider=provider)

    import boto3
    from botocore.config import Config

    server, endpoint = serve()
    config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=10)
    client = boto3.client("bedrock-runtime", endpoint_url=endpoint, config=config)
    timing = None
    if helper:  # the service's one line, after the instrumentor is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(client, tracer_provider=provider)
    tracer = provider.get_tracer("rag-api")
    truth = [ask(library, tracer, client, case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = f"bedrock_{library}" + ("_helper" if helper else "")
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc: dict[str, Any] = {"library": name, "versions": versions(library), "tenant": capture.TENANT}
    if timing is not None:
        doc["helper"] = "ttft_emit.otel.time_first_chunk"
        doc["helper_stats"] = asdict(timing.stats)
    doc["traces"] = truth
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    if timing is not None:
        print(f"# helper stats: {doc['helper_stats']}")
    capture.print_spans(spans, truth, KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), help="run one library (this process)")
    parser.add_argument("--only", nargs="+", choices=sorted(LIBRARIES), help="run these libraries (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--helper", action="store_true", help="time the client with ttft-emit's helper (*_helper.*)")
    args = parser.parse_args()
    # fake credentials and a region: the stub checks no signature, and nothing leaves loopback
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "AKIDSTUBSTUBSTUBSTUB")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "stub-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.pop("AWS_PROFILE", None)
    if args.library:
        run_library(args.library, args.out, args.helper)
        return
    for library in args.only or LIBRARIES:  # one process each: the libraries patch the same client
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)] + ["--helper"] * args.helper
        subprocess.run(cmd, check=True, timeout=120)
        print(f"{library}: {args.out / (f'bedrock_{library}' + ('_helper' if args.helper else '') + '.otlp')}")


if __name__ == "__main__":
    main()
