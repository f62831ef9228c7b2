"""``ttft demo --otel``'s OpenTelemetry tenant: a RAG service traced by a real instrumentation library.

Runs in the instrumentation venv (:mod:`streams.otel.instrumentations`), never the project's, one process per
deployed version (``--version``: the stable one, and the canary when the story has one): it imports nothing
of ``streams``. The service calls the real ``openai`` client, instrumented by OpenInference's
``openinference-instrumentation-openai`` (the version pinned in the venv's requirements), against a loopback
OpenAI-compatible stub, and exports its spans with the SDK's ``BatchSpanProcessor`` over OTLP/HTTP to the
Collector. Nothing sets a ``ttft.*`` attribute: the tenant is the resource attribute ``tenant.id``, the
version ``service.version``, the route the model it calls (the stub serves models named ``main`` and
``fast``, as a gateway's aliases), and the stages come from the conventions (docs/otlp-mapping.md):

- ``POST /ask`` (the service's SERVER span): the request's start;
- ``retrieve`` (OpenInference ``RETRIEVER``, as a RAG framework makes it) around the embeddings call (the
  library's ``EMBEDDING`` span inside it: ``vector_recall``) and ``rerank`` (``RERANKER``);
- ``assemble prompt`` (OpenInference ``PROMPT``);
- the library's ``ChatCompletion`` span per LLM attempt (a fallback's first attempt fails with a 504 after its
  timeout; its span, streaming with no first chunk, is mapped ``llm_unmeasured``), whose ``First Token Stream
  Event`` is the first token; tokens and cache hits from the usage the stub streams;
- ``load_session``: a span of no stage (counted ``not_stage``).

The demo plays 26 minutes of history in 3: each request (one JSON line on stdin from
:mod:`streams.demo.otel_traffic`, with the story's times in epoch ms) is played on the story's clock. The
SDK's span clock (``opentelemetry.sdk.trace.time_ns``) is replaced by :class:`StoryClock`, which the service
moves to each stage's start and the stub to each answer's time before it answers; requests are played one
after the other. So every span, and the library's first-token event, carries the story's times exactly,
and the library runs unmodified. What the story has and no instrumentation tells is left out: BM25 recall,
the prompt-cache and draft-acceptance attributes, the fallback level, the rollout (every request is
``stable``). The batch processor exports between two requests only (every :data:`FLUSH_EVERY_S`), never in
the middle of one: the story's clock runs ~35 times faster than the wall clock in a 30 s demo, so a trace
split over two exports 0.2 s apart would reach the join ~7 s of story time apart, past its request
timeout, where a live service's would be a fraction of a second apart.

Prints one JSON line at the end (stdin closed): ``{"traces", "spans", "ttft_attributes", "library"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from typing import Any

LIBRARY = "openinference-instrumentation-openai"
EMBEDDING_MODEL = "text-embedding-3-small"
CHUNKS = ("Paris", " is", " the", " capital", ".")
_MS = 1_000_000
#: Spans go to the Collector every this many seconds of wall time, between two requests (see above).
FLUSH_EVERY_S = 0.2
_QUEUE = 200_000


class StoryClock:
    """The story's time in epoch ns, moved by the service and the stub (one request at a time)."""

    def __init__(self) -> None:
        self.now_ns = 0

    def time_ns(self) -> int:
        return self.now_ns

    def at(self, ms: float) -> None:
        self.now_ns = round(ms * _MS)


class StubAnswers:
    """What the stub answers next: at which story time, and whether it fails (a fallback's first attempt)."""

    def __init__(self, clock: StoryClock) -> None:
        self.clock = clock
        self.at_ms = 0.0
        self.fail = False
        self.usage: dict[str, Any] = {}


def stub_handler(answers: StubAnswers) -> type[BaseHTTPRequestHandler]:
    """``POST /v1/embeddings`` and ``POST /v1/chat/completions`` (streaming), answered at the story time the
    service asked for."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: every body has its length (a stream is sent at once)
        disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK wait between them

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            answers.clock.at(answers.at_ms)
            if answers.fail:
                error = {"error": {"message": "upstream timeout", "type": "timeout"}}
                self._send(504, "application/json", json.dumps(error).encode())
            elif self.path.endswith("/embeddings"):
                data = [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}]
                usage = {"prompt_tokens": 8, "total_tokens": 8}
                doc = {"object": "list", "data": data, "model": body.get("model"), "usage": usage}
                self._send(200, "application/json", json.dumps(doc).encode())
            else:
                self._send(200, "text/event-stream", self._stream(body))

        def _send(self, status: int, content_type: str, raw: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _stream(self, body: dict[str, Any]) -> bytes:
            base = {"id": "chatcmpl-demo", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
            events = []
            for i, text in enumerate(CHUNKS):
                delta = {"content": text, **({"role": "assistant"} if i == 0 else {})}
                events.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            events.append({**base, "choices": [], "usage": answers.usage})
            return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"

    return Handler


class RagService:
    """Plays one request of the story (:meth:`ask`) through the instrumented client."""

    def __init__(self, provider: Any, clock: StoryClock, answers: StubAnswers, base_url: str) -> None:
        import openai

        self.tracer = provider.get_tracer("rag-api")
        self.clock = clock
        self.answers = answers
        self.client = openai.OpenAI(base_url=base_url, api_key="demo-key", max_retries=0)

    def _answer_at(self, ms: float, fail: bool = False) -> None:
        self.answers.at_ms, self.answers.fail = ms, fail

    def _span(self, name: str, start_ms: float, attrs: dict[str, Any]) -> Any:
        self.clock.at(start_ms)
        return self.tracer.start_as_current_span(name, attributes=attrs)

    def ask(self, spec: dict[str, Any]) -> None:
        from opentelemetry.trace import SpanKind

        clock = self.clock
        clock.at(spec["start"])
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER):
            session = self.tracer.start_span("load_session", start_time=clock.now_ns)
            session.end(end_time=clock.now_ns + _MS // 2)
            if spec.get("retrieval"):
                self._retrieve(spec)
            if spec.get("prompt"):
                start, duration = spec["prompt"]
                with self._span("assemble prompt", start, {"openinference.span.kind": "PROMPT"}):
                    clock.at(start + duration)
            self._llm(spec)
            clock.at(spec["end"])

    def _retrieve(self, spec: dict[str, Any]) -> None:
        start, duration = spec["retrieval"]
        with self._span("retrieve", start, {"openinference.span.kind": "RETRIEVER", "input.value": "question"}):
            if spec.get("vector"):
                v_start, v_duration = spec["vector"]
                self.clock.at(v_start)
                self._answer_at(v_start + v_duration)
                self.client.embeddings.create(model=EMBEDDING_MODEL, input="question")
            if spec.get("rerank"):
                r_start, r_duration = spec["rerank"]
                with self._span("rerank", r_start, {"openinference.span.kind": "RERANKER"}):
                    self.clock.at(r_start + r_duration)
            self.clock.at(start + duration)

    def _llm(self, spec: dict[str, Any]) -> None:
        import openai

        self.answers.usage = {
            "prompt_tokens": spec["prompt_tokens"],
            "completion_tokens": len(CHUNKS),
            "total_tokens": spec["prompt_tokens"] + len(CHUNKS),
            "prompt_tokens_details": {"cached_tokens": spec["cached_tokens"]},
        }
        messages: Any = [{"role": "user", "content": "question"}]
        attempts = spec["llm"]
        for index, (start, duration) in enumerate(attempts):
            last = index == len(attempts) - 1
            self.clock.at(start)
            self._answer_at(start + duration, fail=not last)
            try:
                stream = self.client.chat.completions.create(
                    model=spec["model"], messages=messages, stream=True, stream_options={"include_usage": True}
                )
                for i, _ in enumerate(stream):
                    if i == 0:  # the library stamped its first-token event; the stream runs on a while
                        self.clock.at(start + duration + spec["tail"])
            except openai.APIStatusError:
                if last:
                    raise


class SpanCount:
    """A span processor counting the exported spans and any ``ttft.*`` attribute on them or their resource."""

    def __init__(self) -> None:
        self.spans = 0
        self.ttft_attributes = 0

    def processor(self) -> Any:
        from opentelemetry.sdk.trace import SpanProcessor

        count = self

        class _Count(SpanProcessor):  # type: ignore[misc]
            def on_end(self, span: Any) -> None:
                count.spans += 1
                names = [*(span.attributes or {}), *span.resource.attributes]
                count.ttft_attributes += sum(1 for name in names if str(name).startswith("ttft."))

        return _Count()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="OTLP/HTTP base URL of the Collector")
    parser.add_argument("--tenant", required=True, help="the resource attribute tenant.id")
    parser.add_argument("--version", required=True, help="the resource attribute service.version")
    args = parser.parse_args(argv)

    import opentelemetry.sdk.trace as sdk_trace
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    clock = StoryClock()
    sdk_trace.time_ns = clock.time_ns  # type: ignore[attr-defined]  # the spans' clock: the story's
    resource = {"service.name": "rag-api-otel-demo", "service.version": args.version, "tenant.id": args.tenant}
    provider = sdk_trace.TracerProvider(resource=Resource.create(resource))
    count = SpanCount()
    provider.add_span_processor(count.processor())
    exporter = OTLPSpanExporter(endpoint=f"{args.endpoint}/v1/traces", timeout=30)
    # Exported only at request boundaries (flush_every): see the module's docstring.
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, max_queue_size=_QUEUE, schedule_delay_millis=3_600_000, max_export_batch_size=_QUEUE
        )
    )
    OpenAIInstrumentor().instrument(tracer_provider=provider)

    answers = StubAnswers(clock)
    server = ThreadingHTTPServer(("127.0.0.1", 0), stub_handler(answers))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    service = RagService(provider, clock, answers, f"http://127.0.0.1:{server.server_address[1]}/v1")
    traces = 0
    flushed_at = time.monotonic()
    for line in sys.stdin:
        if line.strip():
            service.ask(json.loads(line))
            traces += 1
        if time.monotonic() - flushed_at >= FLUSH_EVERY_S:
            provider.force_flush(timeout_millis=30_000)
            flushed_at = time.monotonic()
    server.shutdown()
    flushed = provider.force_flush(timeout_millis=60_000)
    provider.shutdown()
    summary = {
        "traces": traces,
        "spans": count.spans,
        "ttft_attributes": count.ttft_attributes,
        "library": f"{LIBRARY} {metadata.version(LIBRARY)}",
        "flushed": flushed,
    }
    print(json.dumps(summary), flush=True)
    return 0 if flushed else 1


if __name__ == "__main__":
    sys.exit(main())
