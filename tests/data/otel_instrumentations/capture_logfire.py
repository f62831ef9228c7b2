"""Capture the spans Pydantic Logfire's LLM instrumentation exports (``logfire.instrument_openai()``,
``logfire.instrument_anthropic()``) against the loopback stubs of capture_responses.py (capture.py's OpenAI stub
plus ``POST /v1/responses``) and capture_anthropic.py (the Messages API with real SSE events); write
``logfire_<library>.otlp`` (4-byte big-endian length + one ExportTraceServiceRequest per trace, capture.py's
``write_traces``) and ``logfire_<library>.json`` (what the client saw) beside this file, then print a span table.

Logfire is configured to send nothing anywhere: ``logfire.configure(send_to_logfire=False, console=False,
metrics=False, additional_span_processors=[SimpleSpanProcessor(InMemorySpanExporter())], resource_attributes=
{"tenant.id": "acme"})`` (the OTLP endpoint variables are removed from the environment of each run, since
Logfire would add an OTLP exporter for them). ``logfire.configure`` sets the global tracer provider; the
service's own spans come from an OpenTelemetry tracer of that provider (``trace.get_tracer("rag-api")``).

Libraries, each in its own process:

- ``openai``: ``logfire.instrument_openai(client)`` on an ``openai.OpenAI`` client; cases ``stream``
  (``chat.completions.create(stream=True, stream_options={"include_usage": True})``), ``non_stream`` and
  ``responses_stream`` (``responses.create(stream=True)``);
- ``anthropic``: ``logfire.instrument_anthropic(client)`` on an ``anthropic.Anthropic`` client; cases ``stream``
  (``messages.create(stream=True)``), ``stream_helper`` (``messages.stream()``), ``non_stream``. The SDK's
  own tracing (anthropic 2.x, scope ``com.anthropic.sdk.python``) is on: it uses the global provider, which
  Logfire set;
- ``anthropic_nosdk``: the same with ``anthropic.Anthropic(open_telemetry=False)``: Logfire's spans alone.

``openai_helper`` / ``anthropic_helper`` (run only when named): ``openai`` / ``anthropic`` with the client then timed
by ttft-emit's helper, after ``logfire.instrument_*``: ``time_first_chunk(client, tracer_provider=<the global
provider Logfire set>, fill_missing=True)`` (from this repository's ``emitter/src``, put on ``sys.path``, as
capture_responses.py does). Logfire's ``ProxyTracerProvider`` takes a span processor
(``add_span_processor`` hands it to its SDK ``TracerProvider``, which Logfire's spans go through), and its
tracer gives the helper's own span (the span ends with the response headers, before the first chunk: the
helper makes its own ``chat <model>``). The json also holds the helper's ``stats`` after the warm-up
(``helper_stats_warm_up``) and at the end (``helper_stats``).

With Logfire's default ``suppress_other_instrumentation=True`` the SDK's spans are not exported: the SDK starts
its span inside ``client.request``, which Logfire wraps in ``suppress_instrumentation()``, so Logfire's tracer
gives it a non-recording span. ``--library anthropic_unsuppressed`` (not run by default) is ``anthropic`` with
``logfire.instrument_anthropic(client, suppress_other_instrumentation=False)``: the SDK's span then is exported,
inside Logfire's.

Each request is a trace: root span ``POST /ask`` (SERVER), a retrieval span ``retrieval docs`` (CLIENT,
``gen_ai.operation.name = retrieval``) around :data:`capture_anthropic.RETRIEVAL_S` of vector search,
:data:`capture.PROMPT_WORK_S` of prompt work, then the call. The json records per trace the client's wall
time (ns) at the root span's start, just before the call, at the first output text it saw (the first chat
chunk with content, the first ``response.output_text.delta``, the first ``text_delta``) and when the call was
done; and the versions. One call of each case runs first, outside any root span, and is not written (the
SDKs' first calls import and build their types, ~40-60 ms for the Responses API; a running service pays it
once).

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/lf
    /tmp/lf/bin/pip install -r tests/data/otel_instrumentations/requirements-logfire.txt
    /tmp/lf/bin/python tests/data/otel_instrumentations/capture_logfire.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # write_traces, the timing constants
import capture_anthropic  # the Messages API stub, its ask()
import capture_responses  # the OpenAI stub with POST /v1/responses

OUT = Path(__file__).resolve().parent
LIBRARIES = ("openai", "anthropic", "anthropic_nosdk")
#: Run only when named (``--library`` / ``--only``).
EXTRA_LIBRARIES = ("anthropic_unsuppressed", "openai_helper", "anthropic_helper")
#: ttft-emit's sources (the ``*_helper`` libraries), imported from the repository rather than installed.
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES: dict[str, tuple[str, ...]] = {
    "openai": ("stream", "non_stream", "responses_stream"),
    "anthropic": capture_anthropic.CASES,
    "anthropic_nosdk": capture_anthropic.CASES,
    "anthropic_unsuppressed": capture_anthropic.CASES,
    "openai_helper": ("stream", "non_stream", "responses_stream"),
    "anthropic_helper": capture_anthropic.CASES,
}
COMMON_DISTRIBUTIONS = (
    "logfire",
    "logfire-sdk",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-common",
)
CLIENT_DISTRIBUTIONS = {"openai": ("openai", "httpx2"), "anthropic": ("anthropic", "httpx2")}
#: Environment variables under which Logfire would export elsewhere (an OTLP endpoint, its own token).
UNSET_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "LOGFIRE_TOKEN",
    "LOGFIRE_SEND_TO_LOGFIRE",
)


def versions(library: str) -> dict[str, str]:
    client = CLIENT_DISTRIBUTIONS["openai" if library.startswith("openai") else "anthropic"]
    return {name: metadata.version(name) for name in (*COMMON_DISTRIBUTIONS, *client)}


def openai_call(client: Any, case: str) -> tuple[int | None, int]:
    """The call of ``case``; when the client saw the first output text (streaming) and when it was done."""
    first = None
    messages: Any = [{"role": "user", "content": capture_anthropic.QUESTION}]
    if case == "stream":
        stream = client.chat.completions.create(
            model=capture.MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.time_ns()
    elif case == "responses_stream":
        stream = client.responses.create(model=capture.MODEL, input=capture_anthropic.QUESTION, stream=True)
        for event in stream:
            if first is None and event.type == "response.output_text.delta":
                first = time.time_ns()
    else:
        client.chat.completions.create(model=capture.MODEL, messages=messages)
    return first, time.time_ns()


def openai_ask(tracer: Any, client: Any, case: str) -> dict[str, Any]:
    """One request of ``case`` (capture_anthropic.ask's shape, the OpenAI call); what the client saw."""
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
        with capture.retrieval_span(tracer, "gen_ai"):
            time.sleep(capture_anthropic.RETRIEVAL_S)  # the vector search
        time.sleep(capture.PROMPT_WORK_S)
        called_ns = time.time_ns()
        first_chunk_ns, answered_ns = openai_call(client, case)
    return {
        "case": case,
        "trace_id": format(root.get_span_context().trace_id, "032x"),
        "streaming": case != "non_stream",
        "started_ns": root.start_time,
        "called_ns": called_ns,
        "first_chunk_ns": first_chunk_ns,
        "answered_ns": answered_ns,
    }


def anthropic_warm_up(client: Any, case: str) -> None:
    messages: Any = [{"role": "user", "content": capture_anthropic.QUESTION}]
    kw = {"model": capture_anthropic.MODEL, "max_tokens": capture_anthropic.MAX_TOKENS, "messages": messages}
    if case == "stream":
        for _ in client.messages.create(stream=True, **kw):
            pass
    elif case == "stream_helper":
        with client.messages.stream(**kw) as s:
            for _ in s.text_stream:
                pass
    else:
        client.messages.create(**kw)


def run_library(library: str, out: Path) -> None:
    """One process: configure Logfire, instrument the client, run the cases, write the capture, print the table."""
    from dataclasses import asdict

    import logfire
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    for name in UNSET_ENV:
        os.environ.pop(name, None)
    exporter = InMemorySpanExporter()
    logfire.configure(
        send_to_logfire=False,
        console=False,
        metrics=False,
        service_name=f"rag-logfire-{library}",
        service_version="1.4.2",
        resource_attributes={"tenant.id": capture.TENANT},
        additional_span_processors=[SimpleSpanProcessor(exporter)],
        inspect_arguments=False,
    )
    tracer = trace.get_tracer("rag-api")
    helper = library.endswith("_helper")
    timing = None

    def time_client(client: Any) -> Any:
        """The service's one line, after ``logfire.instrument_*``: ttft-emit's helper on the client."""
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        # The global provider Logfire set (its ProxyTracerProvider): add_span_processor goes to its SDK provider.
        return time_first_chunk(client, tracer_provider=trace.get_tracer_provider(), fill_missing=True)

    if library.startswith("openai"):
        import openai

        server, base_url = capture_responses.serve()
        client = openai.OpenAI(base_url=base_url, api_key="stub-key", max_retries=0, timeout=10.0)
        logfire.instrument_openai(client)
        if helper:
            timing = time_client(client)
        for case in CASES[library]:  # warm-up, not written
            openai_call(client, case)
        warm_stats = asdict(timing.stats) if timing is not None else None
        truth = [openai_ask(tracer, client, case) for case in CASES[library]]
    else:
        import anthropic

        server, base_url = capture_anthropic.serve()
        options: dict[str, Any] = {"open_telemetry": False} if library == "anthropic_nosdk" else {}
        client = anthropic.Anthropic(base_url=base_url, api_key="stub-key", max_retries=0, timeout=10.0, **options)
        logfire.instrument_anthropic(client, suppress_other_instrumentation=library != "anthropic_unsuppressed")
        if helper:
            timing = time_client(client)
        for case in CASES[library]:  # warm-up, not written
            anthropic_warm_up(client, case)
        warm_stats = asdict(timing.stats) if timing is not None else None
        truth = [capture_anthropic.ask("logfire", tracer, client, case) for case in CASES[library]]
    server.shutdown()
    logfire.force_flush()
    spans = exporter.get_finished_spans()
    name = f"logfire_{library}"
    capture.write_traces(out / f"{name}.otlp", spans, truth)
    doc: dict[str, Any] = {"library": name, "versions": versions(library), "tenant": capture.TENANT}
    if timing is not None:
        doc["helper"] = "ttft_emit.otel.time_first_chunk"
        doc["helper_stats_warm_up"] = warm_stats
        doc["helper_stats"] = asdict(timing.stats)
    doc["traces"] = truth
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"# {name}: {doc['versions']}")
    if timing is not None:
        print(f"# helper stats: after warm-up {warm_stats}, at the end {doc['helper_stats']}")
    capture.print_spans(spans, truth, ("",))  # every attribute


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    every = (*LIBRARIES, *EXTRA_LIBRARIES)
    parser.add_argument("--library", choices=every, help="run one library (this process)")
    parser.add_argument("--only", nargs="+", choices=every, help="run these libraries (default: all but the extra)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.library:
        run_library(args.library, args.out)
        return
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    for library in args.only or LIBRARIES:  # one process each: Logfire patches the client and sets the provider
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)]
        subprocess.run(cmd, check=True, timeout=120, env=env)
        print(f"{library}: {args.out / f'logfire_{library}.otlp'}")


if __name__ == "__main__":
    main()
