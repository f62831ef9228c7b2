"""Capture the spans the three OpenAI instrumentations of capture.py export for the **Responses API**
(``client.responses.create`` and ``client.responses.stream``) against a loopback stub of ``POST /v1/responses``;
write responses_<library>.otlp (4-byte big-endian length + one ExportTraceServiceRequest per trace) and
responses_<library>.json (what the client saw) beside this file, then print a span table.

The stub (embeddings as capture.py's) answers ``POST /v1/responses``:

- not streaming: a ``Response`` object (status ``completed``, one output message) after
  :data:`capture.NON_STREAM_DELAY_S`;
- ``"stream": true``: the SSE events the API sends for a plain text answer, each as ``event: <type>`` and
  ``data: <json>`` with its ``sequence_number``: ``response.created`` and ``response.in_progress`` with the
  response headers (the API sends them as soon as it accepts the request, before the model's first token),
  then, :data:`capture.FIRST_CHUNK_DELAY_S` after the request, ``response.output_item.added``,
  ``response.content_part.added`` and the first ``response.output_text.delta``, the other deltas
  :data:`capture.CHUNK_GAP_S` apart, then ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done`` and ``response.completed`` (usage: 812 input tokens of which 512 cached,
  5 output tokens). No ``[DONE]``: the Responses stream ends with the connection.

Three requests per library, each a trace with a root span ``POST /ask`` (SERVER), the retrieval of
capture.RagService (its convention's spans around an embeddings call), :data:`capture.PROMPT_WORK_S` of prompt
work, then the call:

1. ``stream``: ``client.responses.create(stream=True)``, iterated;
2. ``stream_helper``: ``with client.responses.stream(...) as s: for event in s``;
3. ``non_stream``: ``client.responses.create(...)``.

Per trace the .json holds ``called_ns`` (just before the call), ``returned_ns`` (when ``create()`` returned,
or the helper's ``__enter__``), ``first_event_ns`` (the first SSE event of any type the client got),
``first_chunk_ns`` (the first ``response.output_text.delta``: the first token), ``answered_ns``.

One untraced-by-the-service call of each case comes first and is not written: the SDK's first Responses
call imports and builds its types (~40-60 ms, before the instrumentations' spans start), which a long-running
service pays once. Each library runs unmodified in its own process, as in capture.py::

    python3.11 -m venv /tmp/resp
    /tmp/resp/bin/pip install -r tests/data/otel_instrumentations/requirements.txt
    /tmp/resp/bin/python tests/data/otel_instrumentations/capture_responses.py

``--helper``: after the instrumentor is set up, the service's client is timed by ttft-emit's helper
(``time_first_chunk(client, tracer_provider=provider)``, from this repository's ``emitter/src``, put on
``sys.path``: nothing to install); writes responses_<library>_helper.otlp / .json, the .json with the
helper's ``stats`` after the warm-up (``helper_stats_warm_up``) and at the end (``helper_stats``). For
``openai_v2``, which makes no span for the Responses API, with ``fill_missing=True`` (the helper's own span).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, the instrumentors, the retrieval conventions, write_traces

OUT = Path(__file__).resolve().parent
#: ttft-emit's sources (``--helper``), imported from the repository rather than installed.
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = ("stream", "stream_helper", "non_stream")
KEYS = ("first", "token", "stream", "operation", "time", "span.kind", "model", "invocation")
USAGE = {
    "input_tokens": 812,
    "input_tokens_details": {"cached_tokens": 512, "cache_write_tokens": 0},
    "output_tokens": len(capture.CHUNKS),
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 812 + len(capture.CHUNKS),
}


class ResponsesStubHandler(capture.StubHandler):
    """capture.py's stub plus ``POST /v1/responses`` (streaming or not). Each response has ids of its own, as
    the API's (OpenLLMetry keeps every response by its id and merges a later one with the same id into it)."""

    # The events are small writes right after one another: with Nagle's algorithm each would wait for the
    # client's delayed ACK (~40 ms on loopback) and arrive late.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        if not self.path.endswith("/responses"):
            super().do_POST()
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        body["_ids"] = (f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}")
        if body.get("stream"):
            self._stream_response(body)
        else:
            time.sleep(capture.NON_STREAM_DELAY_S)
            output = [_message(body, "completed", "".join(capture.CHUNKS))]
            self._json(_response(body, "completed", output, USAGE))

    def _stream_response(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        seq = iter(range(1_000))
        send = lambda doc: self._sse({**doc, "sequence_number": next(seq)})  # noqa: E731
        send({"type": "response.created", "response": _response(body, "in_progress", [], None)})
        send({"type": "response.in_progress", "response": _response(body, "in_progress", [], None)})
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        where = {"item_id": body["_ids"][1], "output_index": 0, "content_index": 0}
        send({"type": "response.output_item.added", "output_index": 0, "item": _message(body, "in_progress", None)})
        send({"type": "response.content_part.added", **where, "part": _text("")})
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            send({"type": "response.output_text.delta", **where, "delta": text, "logprobs": []})
        full = "".join(capture.CHUNKS)
        send({"type": "response.output_text.done", **where, "text": full, "logprobs": []})
        send({"type": "response.content_part.done", **where, "part": _text(full)})
        send({"type": "response.output_item.done", "output_index": 0, "item": _message(body, "completed", full)})
        output = [_message(body, "completed", full)]
        send({"type": "response.completed", "response": _response(body, "completed", output, USAGE)})

    def _sse(self, doc: dict[str, Any]) -> None:
        self.wfile.write(f"event: {doc['type']}\n".encode() + b"data: " + json.dumps(doc).encode() + b"\n\n")
        self.wfile.flush()


def _text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(body: dict[str, Any], status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_text(text)]
    return {"id": body["_ids"][1], "type": "message", "role": "assistant", "status": status, "content": content}


def _response(body: dict[str, Any], status: str, output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    now = time.time()
    return {
        "id": body["_ids"][0],
        "object": "response",
        "created_at": int(now),
        "completed_at": int(now) if status == "completed" else None,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": None,
        "model": f"{body.get('model')}-2024-07-18",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ResponsesStubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class ResponsesRagService(capture.RagService):
    """capture.RagService whose LLM call is the Responses API."""

    def call(self, case: str) -> dict[str, Any]:
        """The LLM call of ``case``; when the client made it, got it back, saw its first event and first delta."""
        seen: dict[str, int | None] = {"first_event_ns": None, "first_chunk_ns": None}

        def see(event: Any) -> None:
            now = time.time_ns()
            if seen["first_event_ns"] is None:
                seen["first_event_ns"] = now
            if seen["first_chunk_ns"] is None and getattr(event, "type", None) == "response.output_text.delta":
                seen["first_chunk_ns"] = now

        called_ns = time.time_ns()
        if case == "stream":
            stream = self.client.responses.create(model=capture.MODEL, input=self.question, stream=True)
            returned_ns = time.time_ns()
            for event in stream:
                see(event)
        elif case == "stream_helper":
            with self.client.responses.stream(model=capture.MODEL, input=self.question) as s:
                returned_ns = time.time_ns()
                for event in s:
                    see(event)
        else:
            self.client.responses.create(model=capture.MODEL, input=self.question)
            returned_ns = time.time_ns()
        return {"called_ns": called_ns, "returned_ns": returned_ns, **seen, "answered_ns": time.time_ns()}

    def ask(self, case: str) -> dict[str, Any]:  # type: ignore[override]
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            self.retrieve(0, last=True)
            time.sleep(capture.PROMPT_WORK_S)
            seen = self.call(case)
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": case != "non_stream",
            "retrieval_attempts": 1,
            **seen,
        }


def run_library(library: str, out: Path, helper: bool = False) -> None:
    from dataclasses import asdict

    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = capture.instrument(library, resource, [SimpleSpanProcessor(exporter)])
    server, base_url = serve()
    service = ResponsesRagService(library, provider, base_url)
    timing = None
    if helper:  # the service's one line, after the instrumentor is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        # openai-v2 2.4b0 makes no span for the Responses API: the helper makes its own (fill_missing).
        timing = time_first_chunk(service.client, tracer_provider=provider, fill_missing=library == "openai_v2")
    for case in CASES:  # warm-up, not written: the SDK's first Responses call imports and builds its types
        service.call(case)
    warm_stats = asdict(timing.stats) if timing is not None else None
    truth = [service.ask(case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = f"responses_{library}" + ("_helper" if helper else "")
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc: dict[str, Any] = {"library": library, "versions": capture.versions(library), "tenant": capture.TENANT}
    if timing is not None:
        doc["helper"] = "ttft_emit.otel.time_first_chunk"
        doc["helper_stats_warm_up"] = warm_stats
        doc["helper_stats"] = asdict(timing.stats)
    doc["traces"] = truth
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"# {name}: {doc['versions']}")
    if timing is not None:
        print(f"# helper stats: after warm-up {warm_stats}, at the end {doc['helper_stats']}")
    capture.print_spans(spans, truth, KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(capture.LIBRARIES), help="run one library (this process)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--helper", action="store_true", help="time the client with ttft-emit's helper (*_helper.*)")
    args = parser.parse_args()
    if args.library:
        run_library(args.library, args.out, args.helper)
        return
    for library in capture.LIBRARIES:  # one process each: the libraries patch the same client
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)] + ["--helper"] * args.helper
        subprocess.run(cmd, check=True, timeout=120)


if __name__ == "__main__":
    main()
