"""Capture the spans that real OpenAI instrumentations export, as the Collector's Kafka exporter carries them.

A small RAG service calls the ``openai`` client against a local OpenAI-compatible stub on loopback: three
requests per library, each a trace with a root span (the service's ``POST /ask``), the retrieval spans the
library's convention names (made by the service, as a RAG framework would: OpenInference ``RETRIEVER`` and
``RERANKER`` span kinds, or GenAI ``gen_ai.operation.name = retrieval``) around an embeddings call, then a
chat completion:

1. ``stream``: streaming (``stream=True``, usage in the last chunk); the stub sends the first chunk
   :data:`FIRST_CHUNK_DELAY_S` after the request and the rest :data:`CHUNK_GAP_S` apart;
2. ``non_stream``: the same call without streaming (the stub answers after :data:`NON_STREAM_DELAY_S`);
3. ``retried``: streaming, the retrieval tried twice (two sibling retrieval spans under the root; under
   OpenInference a ``RERANKER`` span under the second).

Each library runs unmodified in its own process (they patch the same client), with a
``SimpleSpanProcessor`` into an ``InMemorySpanExporter``. The finished spans are encoded with the OTLP
exporters' own encoder (``encode_spans``) into one ``ExportTraceServiceRequest`` per trace: what the
Collector's Kafka exporter writes with ``encoding: otlp_proto`` and ``partition_traces_by_id: true`` (it
re-encodes the same resource, scope and spans). The tenant is the resource attribute ``tenant.id``, as the
Collector's ``resource`` processor sets it for a team that configures only the Collector.

Outputs in ``--out`` (this folder by default), per library ``<name>``:

- ``<name>.otlp``: the messages, each as a 4-byte big-endian length and the serialized request;
- ``<name>.json``: what the service itself saw per trace (trace id, streaming or not, its retrieval
  attempts, the client's wall time just before the call and at the first chunk, in ns), and the versions.

:class:`RagService`, :func:`instrument` and :func:`serve` are also the live services of issue 25's acceptance
test (``tests/support/instrumented_rag.py``), which exports the same requests to the real Collector.

Run it with a venv of its own (README.md beside this file), never the project's::

    python3.11 -m venv /tmp/instr
    /tmp/instr/bin/pip install -r tests/data/otel_instrumentations/requirements.txt
    /tmp/instr/bin/python tests/data/otel_instrumentations/capture.py
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any, Final

#: Library name -> (distribution, module of its ``OpenAIInstrumentor``).
LIBRARIES: dict[str, tuple[str, str]] = {
    "openinference": ("openinference-instrumentation-openai", "openinference.instrumentation.openai"),
    "openllmetry": ("opentelemetry-instrumentation-openai", "opentelemetry.instrumentation.openai"),
    "openai_v2": ("opentelemetry-instrumentation-openai-v2", "opentelemetry.instrumentation.openai_v2"),
}
OTHER_DISTRIBUTIONS = ("openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-common")
TENANT = "acme"
MODEL = "gpt-4o-mini"
EMBEDDING_MODEL = "text-embedding-3-small"
FIRST_CHUNK_DELAY_S = 0.120
CHUNK_GAP_S = 0.030
CHUNKS = ("Paris", " is", " the", " capital", ".")
NON_STREAM_DELAY_S = 0.150
EMBEDDING_DELAY_S = 0.040
#: The service's own work between retrieval and the LLM call (prompt assembly), which no library traces.
PROMPT_WORK_S = 0.025
USAGE = {
    "prompt_tokens": 812,
    "completion_tokens": len(CHUNKS),
    "total_tokens": 812 + len(CHUNKS),
    "prompt_tokens_details": {"cached_tokens": 512},
}


class StubHandler(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions`` (streaming or not) and ``POST /v1/embeddings``, with fixed delays."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no chunked encoding to write

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path.endswith("/embeddings"):
            time.sleep(EMBEDDING_DELAY_S)
            data = [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}]
            usage = {"prompt_tokens": 8, "total_tokens": 8}
            self._json({"object": "list", "data": data, "model": body.get("model"), "usage": usage})
        elif body.get("stream"):
            self._stream(body)
        else:
            time.sleep(NON_STREAM_DELAY_S)
            message = {"role": "assistant", "content": "".join(CHUNKS)}
            self._json(
                {
                    "id": "chatcmpl-stub",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": USAGE,
                }
            )

    def _json(self, doc: dict[str, Any]) -> None:
        raw = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(CHUNKS):
            if i:
                time.sleep(CHUNK_GAP_S)
            delta: dict[str, Any] = {"content": text}
            if i == 0:
                delta["role"] = "assistant"
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "finish_reason": None}]))
        self._event(self._chunk(body, [{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**self._chunk(body, []), "usage": USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _chunk(self, body: dict[str, Any], choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": choices,
        }

    def _event(self, doc: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
        self.wfile.flush()


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def versions(library: str) -> dict[str, str]:
    return {name: metadata.version(name) for name in (LIBRARIES[library][0], *OTHER_DISTRIBUTIONS)}


def instrument(library: str, resource_attrs: dict[str, Any], processors: list[Any]) -> Any:
    """A tracer provider with ``resource_attrs`` and ``processors``, and the library's ``OpenAIInstrumentor``
    instrumenting the ``openai`` client with it (once per process: the libraries patch the same client)."""
    import importlib

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create(resource_attrs))
    for processor in processors:
        provider.add_span_processor(processor)
    importlib.import_module(LIBRARIES[library][1]).OpenAIInstrumentor().instrument(tracer_provider=provider)
    return provider


class RagService:
    """The service: ``ask(case)`` is one request, a trace with a root span (``POST /ask``), the retrieval spans
    of the library's convention around an embeddings call, the prompt work no library traces, then the chat
    completion (streaming or not) against the stub at ``base_url``."""

    question = "What is the capital of France?"

    def __init__(self, library: str, provider: Any, base_url: str) -> None:
        import openai

        self.library = library
        self.tracer = provider.get_tracer("rag-api")
        self.client = openai.OpenAI(base_url=base_url, api_key="stub-key", max_retries=0)

    def retrieve(self, attempt: int, last: bool) -> None:
        """One retrieval attempt: the convention's retrieval span around an embeddings call (and, under
        OpenInference, a reranker: after the retriever, or inside the retried one)."""
        from opentelemetry.trace import SpanKind

        tracer, client, question = self.tracer, self.client, self.question
        if self.library == "openinference":
            attrs = {"openinference.span.kind": "RETRIEVER", "input.value": question}
            with tracer.start_as_current_span("retrieve", attributes=attrs):
                client.embeddings.create(model=EMBEDDING_MODEL, input=question)
                time.sleep(0.020 if attempt == 0 and not last else 0.060)  # the vector search
                if attempt == 1:
                    with tracer.start_as_current_span("rerank", attributes={"openinference.span.kind": "RERANKER"}):
                        time.sleep(0.030)
            if attempt == 0 and last:
                with tracer.start_as_current_span("rerank", attributes={"openinference.span.kind": "RERANKER"}):
                    time.sleep(0.030)
        else:
            attrs = {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "docs"}
            with tracer.start_as_current_span("retrieval docs", kind=SpanKind.CLIENT, attributes=attrs):
                client.embeddings.create(model=EMBEDDING_MODEL, input=question)
                time.sleep(0.020 if attempt == 0 and not last else 0.060)

    def ask(self, case: str) -> dict[str, Any]:
        """One request of ``case`` (``stream``, ``non_stream`` or ``retried``); what the client saw."""
        from opentelemetry.trace import SpanKind

        streaming = case != "non_stream"
        attempts = 2 if case == "retried" else 1
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            for attempt in range(attempts):
                self.retrieve(attempt, last=attempt == attempts - 1)
            time.sleep(PROMPT_WORK_S)
            messages: Any = [{"role": "user", "content": self.question}]
            called_ns = time.time_ns()
            first_chunk_ns = None
            if streaming:
                stream = self.client.chat.completions.create(
                    model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
                )
                for _ in _chunks(stream):
                    if first_chunk_ns is None:
                        first_chunk_ns = time.time_ns()
            else:
                self.client.chat.completions.create(model=MODEL, messages=messages)
            answered_ns = time.time_ns()
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": streaming,
            "retrieval_attempts": attempts,
            "called_ns": called_ns,
            "first_chunk_ns": first_chunk_ns,
            "answered_ns": answered_ns,
        }


def retrieval_span(tracer: Any, convention: str, question: str = RagService.question) -> Any:
    """The service's retrieval span by ``convention`` (a context manager): OpenInference's ``RETRIEVER`` kind, or
    (any other) the GenAI ``retrieval`` operation."""
    from opentelemetry.trace import SpanKind

    if convention == "openinference":
        attrs = {"openinference.span.kind": "RETRIEVER", "input.value": question}
        return tracer.start_as_current_span("retrieve", attributes=attrs)
    attrs = {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "docs"}
    return tracer.start_as_current_span("retrieval docs", kind=SpanKind.CLIENT, attributes=attrs)


def write_traces(path: Path, spans: Any, traces: list[dict[str, Any]]) -> None:
    """Each of ``traces``' spans as one ``ExportTraceServiceRequest`` after its 4-byte big-endian length, in
    ``traces``' order: what the Collector's Kafka exporter carries, one message per trace."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    with path.open("wb") as f:
        for trace in traces:
            mine = [s for s in spans if format(s.context.trace_id, "032x") == trace["trace_id"]]
            raw = encode_spans(mine).SerializeToString()
            f.write(struct.pack(">I", len(raw)) + raw)


def write_capture(
    out: Path,
    name: str,
    spans: Any,
    truth: list[dict[str, Any]],
    versions: dict[str, str],
    keys: tuple[str, ...],
    *,
    helper: bool = False,
    timing: Any = None,
    warm: dict[str, int] | None = None,
) -> None:
    """A capture's files in ``out``: ``<name>.otlp`` (:func:`write_traces`) and ``<name>.json`` (the versions, the
    tenant, with ``helper`` or ``timing`` the helper and its ``stats`` after the warm-up and at the end, and what
    the service saw per trace); then the span table (:func:`print_spans`)."""
    from dataclasses import asdict

    write_traces(out / f"{name}.otlp", spans, truth)
    doc: dict[str, Any] = {"library": name, "versions": versions, "tenant": TENANT}
    if helper or timing is not None:
        doc["helper"] = "ttft_emit.otel.time_first_chunk"
    if timing is not None:
        doc |= {"helper_stats_warm_up": warm, "helper_stats": asdict(timing.stats)}
    doc["traces"] = truth
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"# {name}: {versions}")
    if timing is not None:
        print(f"# helper stats: after warm-up {warm}, at the end {doc['helper_stats']}")
    print_spans(spans, truth, keys)


#: ``--isolated``: the command runs in a network namespace of its own whose only interface is the loopback.
ISOLATED: Final = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "isolated"]


def run_setups(
    script: str,
    setups: Any,
    out: Path,
    prefix: str,
    timeout_s: float = 120,
    python: Callable[[str], str] | None = None,
    isolated: bool = False,
) -> None:
    """Each of ``setups`` in a process of its own (``script --setup S --out OUT``): their libraries patch the same
    classes. ``python(S)``: its interpreter (default: this one); ``isolated``: with no network but the loopback."""
    out.mkdir(parents=True, exist_ok=True)
    for setup in setups:
        cmd = [python(setup) if python else sys.executable, script, "--setup", setup, "--out", str(out)]
        subprocess.run([*ISOLATED, *cmd] if isolated else cmd, check=True, timeout=timeout_s)
        print(f"{setup}: {out / f'{prefix}{setup}.otlp'}")


def setup_main(
    script: str,
    doc: str | None,
    setups: Any,
    run_setup: Callable[[str, Path], None],
    out: Path,
    prefix: str,
    timeout_s: float = 120,
    python_keys: Callable[[str], tuple[str, ...]] | None = None,
) -> None:
    """The command line of a capture with set-ups: ``--setup S`` runs one in this process (``run_setup(S, out)``),
    else each of ``--only S ...`` (default: every one of ``setups``) in a process of its own (:func:`run_setups`).
    ``--python KEY=PATH``: the interpreter of the set-ups one of whose ``python_keys(S)`` (default: its name) starts
    with KEY; ``--isolated``: each with no network but the loopback (``unshare -rn``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", choices=sorted(setups), help="run one set-up (this process)")
    parser.add_argument("--only", nargs="+", choices=sorted(setups), help="run these set-ups (default: all)")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="KEY=PATH",
        help="the interpreter of the set-ups whose name (or library) starts with KEY (default: this one)",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="run each set-up with no network but the loopback: unshare -rn, then ip link set lo up",
    )
    args = parser.parse_args()
    if args.setup:
        run_setup(args.setup, args.out)
        return
    pythons = dict(item.split("=", 1) for item in args.python)
    keys = python_keys or (lambda setup: (setup,))

    def python(setup: str) -> str:
        return next((p for k, p in pythons.items() if any(key.startswith(k) for key in keys(setup))), sys.executable)

    run_setups(script, args.only or setups, args.out, prefix, timeout_s, python, args.isolated)


def print_spans(spans: Any, truth: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """For the eye, per trace of ``truth``: what the client saw, and each of its finished SDK spans (scope, kind,
    parent, start and end in ms from the root's start, events, and the attributes whose names hold one of
    ``keys``)."""
    names = {s.context.span_id: s.name for s in spans}
    for t in truth:
        mine = sorted((s for s in spans if format(s.context.trace_id, "032x") == t["trace_id"]), key=_start_time)
        roots = [s.start_time for s in mine if s.parent is None]
        r0 = roots[0] if roots else t["called_ns"]

        def ms(ns: int | None, r0: int = r0) -> str:
            return "-" if ns is None else f"{(ns - r0) / 1e6:8.1f}"

        print(
            f"\n=== {t['case']}  trace {t['trace_id']}  client (ms from the root's start): call {ms(t['called_ns'])},"
            f" first chunk {ms(t.get('first_chunk_ns'))}, answered {ms(t['answered_ns'])}"
        )
        for s in mine:
            parent = names.get(s.parent.span_id, "?") if s.parent else "-"
            scope = s.instrumentation_scope
            print(
                f"  {s.name!r:28} scope={scope.name}/{scope.version} kind={s.kind.name} parent={parent!r}"
                f" start={ms(s.start_time)} end={ms(s.end_time)}"
            )
            for e in s.events:
                print(f"      event {e.name!r} at {ms(e.timestamp)}")
            for k, v in sorted((s.attributes or {}).items()):
                if any(key in k.lower() for key in keys):
                    print(f"      {k} = {str(v)[:160]!r}")


def _start_time(span: Any) -> int:
    return int(span.start_time)


def run_library(library: str, out: Path) -> None:
    """One process: instrument, run the three requests, write ``<library>.otlp`` and ``<library>.json``."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": TENANT}
    provider = instrument(library, resource, [SimpleSpanProcessor(exporter)])
    server, base_url = serve()
    service = RagService(library, provider, base_url)
    truth = [service.ask(case) for case in ("stream", "non_stream", "retried")]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    write_traces(out / f"{library}.otlp", spans, truth)
    doc = {"library": library, "versions": versions(library), "tenant": TENANT, "traces": truth}
    (out / f"{library}.json").write_text(json.dumps(doc, indent=1) + "\n")


def _chunks(stream: Any) -> Iterator[Any]:
    yield from stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), help="run one library (this process)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    if args.library:
        run_library(args.library, args.out)
        return
    for library in LIBRARIES:  # one process each: the libraries patch the same client
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)]
        subprocess.run(cmd, check=True, timeout=120)
        print(f"{library}: {args.out / (library + '.otlp')}")


if __name__ == "__main__":
    main()
