"""Capture the spans LiteLLM's instrumentations (and LiteLLM's own OpenTelemetry callback) export for the
``litellm`` SDK calling capture.py's OpenAI-compatible loopback stub (first chunk
:data:`capture.FIRST_CHUNK_DELAY_S` after the request, a plain answer after :data:`capture.NON_STREAM_DELAY_S`);
write ``litellm_<name>.otlp`` (4-byte big-endian length + one ExportTraceServiceRequest per trace, capture.py's
``write_traces``) and ``litellm_<name>.json`` (what the client saw) beside this file, then print a span table.

The service calls ``litellm.completion(model="openai/gpt-4o-mini", api_base=<stub>/v1, api_key="stub", ...)``
(LiteLLM has no client object: the module function is what its users call, and what the instrumentors patch).

Libraries, each unmodified in its own process (they patch the same module functions), ``<name>``:

- ``openinference``: openinference-instrumentation-litellm's ``LiteLLMInstrumentor`` with our tracer provider;
- ``openinference+openai`` (files ``litellm_openinference_openai.*``): the same and openinference-instrumentation-
  openai's ``OpenAIInstrumentor``: LiteLLM's ``openai/`` provider sends the request through an ``openai`` client,
  but with its low-level ``post("/chat/completions", cast_to=ChatCompletion, stream=...)``
  (``litellm/llms/openai/openai.py``, ``make_sync_openai_chat_completion_request``), not
  ``chat.completions.create``; OpenInference patches ``OpenAI.request`` underneath, so it sees the call too
  (``ChatCompletion``, a child of LiteLLM's span);
- ``openllmetry``: OpenLLMetry's opentelemetry-instrumentation-litellm ``LiteLLMInstrumentor``;
- ``openllmetry+openai`` (``litellm_openllmetry_openai.*``): the same and OpenLLMetry's ``OpenAIInstrumentor``,
  which wraps ``chat.completions.create`` and so never sees LiteLLM's ``post`` (the LiteLLM wrapper also sets
  OpenLLMetry's "suppress language model instrumentation" context key for the call);
- ``litellm_otel``: no instrumentor, LiteLLM's own OpenTelemetry callback as its docs set it up,
  ``litellm.callbacks = ["otel"]``. The callback (``litellm.integrations.opentelemetry.OpenTelemetry``, built
  when the first call resolves the name) reuses the global tracer provider when it is an SDK
  ``TracerProvider`` (``_init_tracing`` -> ``_get_or_create_provider``; it would build its own, with the
  ``OTEL_EXPORTER`` exporter, console by default, only when none is set), so ours is set globally first. It
  writes its span from the success callback, after the call (a stream: after its last chunk), with the
  call's start and end times. Since LiteLLM 1.81, when a span is current (our ``POST /ask``) it writes no span
  of its own and sets the call's attributes on that current span instead;
- ``litellm_otel_span``: the same with ``USE_OTEL_LITELLM_REQUEST_SPAN=true`` (its docs' switch back to a
  ``litellm_request`` span per call);
- ``litellm_otel_semconv``: the same with also ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``
  (span ``chat <model>``, kind CLIENT, ``gen_ai.request.stream``);
- ``litellm_otel_late_root``: ``litellm_otel`` with 100 ms of the service's work after the call inside the root
  (writing the answer), so that the root is still open when LiteLLM's callback runs. Which comes first is a race:
  the callback runs on a logging thread (sync) or task (async) after the call returns; in ``litellm_otel`` the
  root ends right after the call, and the callback's attributes for it come too late ("Setting attribute on
  ended span"), but as little as a ``time.sleep(0)`` after the call (one release of the GIL) lets them land on
  the root;
- ``openinference_helper``, ``openllmetry_helper``: the instrumentor as above, then ttft-emit's helper (from this
  repository's ``emitter/src``, put on ``sys.path``) on the module: ``time_first_chunk(litellm, tracer_provider=
  provider)`` wraps ``litellm.completion`` and ``litellm.acompletion`` (LiteLLM has no client object: given
  ``client=openai.OpenAI()`` it calls that client's ``post`` and parses the response itself, so a client's
  ``chat.completions.create`` wrapper would count 0 calls); their json holds the helper's counters
  (``first_chunk_helper``);
- ``litellm_otel_helper``: ``litellm_otel`` and the same, with ``fill_missing=True``: LiteLLM's callback writes its
  span after the call, so no LLM span starts inside it and the helper makes its own.

Three requests per library, each a trace with a root span ``POST /ask`` (SERVER), a retrieval span of the
library's convention (OpenInference kind ``RETRIEVER``, else ``gen_ai.operation.name = retrieval``) around
:data:`RETRIEVAL_S` of vector search, :data:`capture.PROMPT_WORK_S` of prompt work no library traces, then the call:

1. ``stream``: ``litellm.completion(..., stream=True)``, the chunks iterated;
2. ``non_stream``: ``litellm.completion(...)``;
3. ``stream_async``: ``await litellm.acompletion(..., stream=True)``, ``async for`` over the chunks (in an event
   loop kept running :data:`SETTLE_S` after the request, as a server's is, so LiteLLM's logging tasks run).

Before them the service makes one call of each kind outside any request (``Service.warm_up``; their spans are in
traces of their own and not written): a process's first LiteLLM call spends ~0.5 s in lazy imports and client
set-up inside the call, before its request is sent (655 ms to the first chunk instead of ~125 without it).

The json records per trace the client's wall time (ns) at the root span's start, just before the call, at the
first chunk with content it got (streaming) and when the call was done; and the versions. Traces other than
the requests' that started during them (LiteLLM's callback writes its span as the root of a new trace when it
runs where no span is current) follow the requests' in the ``.otlp`` file and are listed in the json's
``other_traces`` (trace id, the case it ran during, its root span's name). The process waits
:data:`SETTLE_S` before flushing, for LiteLLM's logging threads.

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/llm
    /tmp/llm/bin/pip install -r tests/data/otel_instrumentations/requirements-litellm.txt
    /tmp/llm/bin/python tests/data/otel_instrumentations/capture_litellm.py
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, write_traces, the timing constants

OUT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Library:
    #: (distribution, module, class) of each instrumentor, instrumented with our tracer provider.
    instrumentors: tuple[tuple[str, str, str], ...] = ()
    #: ``litellm.callbacks`` (LiteLLM's own tracing), with our provider set globally first.
    callbacks: tuple[str, ...] = ()
    #: Environment set before ``litellm`` is imported.
    env: dict[str, str] = field(default_factory=dict)
    #: The retrieval span's convention: ``openinference`` or ``genai``.
    convention: str = "genai"
    #: Other distributions whose versions are recorded.
    extra: tuple[str, ...] = ()
    #: ttft-emit's helper: ``None``; ``"wrap"``: ``FirstChunkTiming.wrap`` around ``litellm.completion`` and
    #: ``litellm.acompletion`` (after the instrumentor patched them), its span processor in our provider;
    #: ``"fill"``: the same with ``fill_missing_spans`` (a call that starts no LLM span gets the helper's own).
    helper: str | None = None
    #: The service's work after the call, inside the root span (writing the answer), in seconds.
    post_work_s: float = 0.0


OI_LITELLM = ("openinference-instrumentation-litellm", "openinference.instrumentation.litellm", "LiteLLMInstrumentor")
OI_OPENAI = ("openinference-instrumentation-openai", "openinference.instrumentation.openai", "OpenAIInstrumentor")
OL_LITELLM = ("opentelemetry-instrumentation-litellm", "opentelemetry.instrumentation.litellm", "LiteLLMInstrumentor")
OL_OPENAI = ("opentelemetry-instrumentation-openai", "opentelemetry.instrumentation.openai", "OpenAIInstrumentor")
OI_EXTRA = ("openinference-instrumentation", "openinference-semantic-conventions")
OL_EXTRA = ("opentelemetry-semantic-conventions-ai",)
REQUEST_SPAN = {"USE_OTEL_LITELLM_REQUEST_SPAN": "true"}

LIBRARIES: dict[str, Library] = {
    "openinference": Library(instrumentors=(OI_LITELLM,), convention="openinference", extra=OI_EXTRA),
    "openinference+openai": Library(instrumentors=(OI_LITELLM, OI_OPENAI), convention="openinference", extra=OI_EXTRA),
    "openllmetry": Library(instrumentors=(OL_LITELLM,), extra=OL_EXTRA),
    "openllmetry+openai": Library(instrumentors=(OL_LITELLM, OL_OPENAI), extra=OL_EXTRA),
    "litellm_otel": Library(callbacks=("otel",)),
    "litellm_otel_span": Library(callbacks=("otel",), env=REQUEST_SPAN),
    "litellm_otel_semconv": Library(
        callbacks=("otel",), env={**REQUEST_SPAN, "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"}
    ),
    "litellm_otel_late_root": Library(callbacks=("otel",), post_work_s=0.100),
    "openinference_helper": Library(
        instrumentors=(OI_LITELLM,), convention="openinference", extra=OI_EXTRA, helper="wrap"
    ),
    "openllmetry_helper": Library(instrumentors=(OL_LITELLM,), extra=OL_EXTRA, helper="wrap"),
    "litellm_otel_helper": Library(callbacks=("otel",), helper="fill"),
}
#: ttft-emit's source (its ``ttft_emit.otel`` needs only ``opentelemetry-sdk``), for the helper variants.
EMITTER_SRC = Path(__file__).resolve().parents[3] / "emitter" / "src"
OTHER_DISTRIBUTIONS = (
    "litellm",
    "openai",
    "httpx",
    "aiohttp",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-common",
)
CASES = ("stream", "non_stream", "stream_async")
MODEL = f"openai/{capture.MODEL}"
QUESTION = "What is the capital of France?"
#: The vector search inside the retrieval span.
RETRIEVAL_S = 0.050
#: How long the event loop (async case) and the process (before the flush) run on after the requests.
SETTLE_S = 1.0
KEYS = ("first", "token", "stream", "operation", "kind", "invocation", "time", "model", "litellm", "span")


def file_name(library: str) -> str:
    """``litellm_<library>``, ``+`` as ``_`` (``litellm_otel*`` as themselves)."""
    return "litellm_" + library.removeprefix("litellm_").replace("+", "_")


def versions(library: str) -> dict[str, str]:
    spec = LIBRARIES[library]
    names = (*(dist for dist, _, _ in spec.instrumentors), *spec.extra, *OTHER_DISTRIBUTIONS)
    found = {name: metadata.version(name) for name in names}
    if spec.helper:  # from the source tree, not installed
        import ttft_emit

        found["ttft-emit"] = ttft_emit.__version__
    return found


def has_content(chunk: Any) -> bool:
    """Whether a LiteLLM chunk carries output text (its first choice's delta content)."""
    choices = getattr(chunk, "choices", None) or []
    return bool(choices and getattr(getattr(choices[0], "delta", None), "content", None))


class Service:
    """``ask(case)`` / ``ask_async(case)``: one request, a trace of its own."""

    def __init__(self, library: str, tracer: Any, base_url: str) -> None:
        self.convention = LIBRARIES[library].convention
        self.post_work_s = LIBRARIES[library].post_work_s
        self.tracer = tracer
        self.base_url = base_url

    def _retrieval(self) -> Any:
        return capture.retrieval_span(self.tracer, self.convention, QUESTION)

    def _kwargs(self, stream: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": QUESTION}],
            "api_base": self.base_url,
            "api_key": "stub",
            "timeout": 10.0,
            "max_retries": 0,
        }
        if stream:
            kwargs.update(stream=True, stream_options={"include_usage": True})
        return kwargs

    def _truth(self, case: str, root: Any, called_ns: int, first_chunk_ns: int | None) -> dict[str, Any]:
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": case != "non_stream",
            "started_ns": root.start_time,
            "called_ns": called_ns,
            "first_chunk_ns": first_chunk_ns,
            "answered_ns": time.time_ns(),
        }

    def warm_up(self) -> None:
        """One call of each kind outside any request (their spans are in traces of their own, not written): the
        first LiteLLM call of a process pays ~0.5 s of lazy imports and client set-up inside the call."""
        import litellm

        for _ in litellm.completion(**self._kwargs(stream=True)):
            pass
        litellm.completion(**self._kwargs(stream=False))

        async def stream() -> None:
            async for _ in await litellm.acompletion(**self._kwargs(stream=True)):
                pass

        asyncio.run(stream())

    def ask(self, case: str) -> dict[str, Any]:
        import litellm
        from opentelemetry.trace import SpanKind

        first_chunk_ns = None
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with self._retrieval():
                time.sleep(RETRIEVAL_S)
            time.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            if case == "stream":
                for chunk in litellm.completion(**self._kwargs(stream=True)):
                    if first_chunk_ns is None and has_content(chunk):
                        first_chunk_ns = time.time_ns()
            else:
                litellm.completion(**self._kwargs(stream=False))
            truth = self._truth(case, root, called_ns, first_chunk_ns)
            if self.post_work_s:  # (even sleep(0) lets LiteLLM's logging thread run before the root ends)
                time.sleep(self.post_work_s)
        return truth

    async def ask_async(self, case: str) -> dict[str, Any]:
        import litellm
        from opentelemetry.trace import SpanKind

        first_chunk_ns = None
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with self._retrieval():
                await asyncio.sleep(RETRIEVAL_S)
            await asyncio.sleep(capture.PROMPT_WORK_S)
            called_ns = time.time_ns()
            stream = await litellm.acompletion(**self._kwargs(stream=True))
            async for chunk in stream:
                if first_chunk_ns is None and has_content(chunk):
                    first_chunk_ns = time.time_ns()
            truth = self._truth(case, root, called_ns, first_chunk_ns)
            if self.post_work_s:
                await asyncio.sleep(self.post_work_s)
        await asyncio.sleep(SETTLE_S)  # a server's loop runs on: LiteLLM's logging tasks finish
        return truth


def run_library(library: str, out: Path) -> None:
    """One process: instrument, run the cases, write the capture and print the span table."""
    spec = LIBRARIES[library]
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the cost map at import
    os.environ.update(spec.env)

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": f"rag-litellm-{library}", "tenant.id": capture.TENANT})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if spec.callbacks:  # LiteLLM's callback reuses the global SDK provider
        trace.set_tracer_provider(provider)
    for _, module, cls in spec.instrumentors:
        getattr(importlib.import_module(module), cls)().instrument(tracer_provider=provider)

    import litellm

    if spec.callbacks:
        litellm.callbacks = list(spec.callbacks)
    helper = None
    if spec.helper:  # the service's lines, after the instrumentor: LiteLLM has no client object to give it
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        helper = time_first_chunk(litellm, tracer_provider=provider, fill_missing=spec.helper == "fill")

    server, base_url = capture.serve()
    service = Service(library, provider.get_tracer("rag-api"), base_url)
    service.warm_up()
    time.sleep(SETTLE_S)
    truth = []
    for case in CASES:
        if case == "stream_async":
            truth.append(asyncio.run(service.ask_async(case)))
        else:
            truth.append(service.ask(case))
    time.sleep(SETTLE_S)  # LiteLLM's logging threads
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = file_name(library)
    others = other_traces(spans, truth)
    capture.write_traces(out / f"{name}.otlp", spans, [*truth, *others])
    doc = {
        "library": name,
        "versions": versions(library),
        "tenant": capture.TENANT,
        "traces": truth,
        "other_traces": others,
    }
    if helper is not None:
        doc["first_chunk_helper"] = dataclasses.asdict(helper.stats)
        print(f"first_chunk_helper: {doc['first_chunk_helper']}")
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    capture.print_spans(spans, truth, KEYS)


def other_traces(spans: Any, truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The traces, other than the requests', whose spans started during the requests (LiteLLM's callback makes
    its span a root of a trace of its own when it finds no current span: the sync stream's success handler runs
    on a thread without the caller's context), each with the request it ran in (``during``) and its root span's
    name. They follow the requests' traces in the ``.otlp`` file, as the Collector would carry them."""
    ours = {t["trace_id"] for t in truth}
    first = min(t["started_ns"] for t in truth)
    found: dict[str, dict[str, Any]] = {}
    for s in sorted(spans, key=lambda s: s.start_time):
        trace_id = format(s.context.trace_id, "032x")
        if trace_id in ours or s.start_time < first or trace_id in found:
            continue
        during = max((t for t in truth if t["started_ns"] <= s.start_time), key=lambda t: t["started_ns"])
        roots = [r.name for r in spans if r.parent is None and format(r.context.trace_id, "032x") == trace_id]
        found[trace_id] = {"trace_id": trace_id, "during": during["case"], "root": roots[0] if roots else None}
    return list(found.values())


def _print_trace(t: dict[str, Any], spans: Any, names: dict[int, str], what: str) -> None:
    r0 = t["started_ns"]
    ms = lambda ns, r0=r0: f"{(ns - r0) / 1e6:7.1f}"  # noqa: E731
    first = t["first_chunk_ns"]
    print(
        f"\n=== {what} {t['case']}  client (ms from the request root's start): call {ms(t['called_ns'])},"
        f" first chunk {ms(first) if first else '-'}, answered {ms(t['answered_ns'])}"
    )
    for s in sorted(spans, key=lambda s: s.start_time):
        parent = names.get(s.parent.span_id, "?") if s.parent else "-"
        sc = s.instrumentation_scope
        print(
            f"  {s.name!r:22} scope={sc.name}/{sc.version} kind={s.kind.name} parent={parent!r}"
            f" start={ms(s.start_time)} end={ms(s.end_time)} status={s.status.status_code.name}"
        )
        for e in s.events:
            print(f"      event {e.name!r} at {ms(e.timestamp)}")
        for k, v in sorted(s.attributes.items()):
            if any(key in k.lower() for key in KEYS):
                print(f"      {k} = {str(v)[:160]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", choices=sorted(LIBRARIES), help="run one library (this process)")
    parser.add_argument("--only", nargs="+", choices=sorted(LIBRARIES), help="run these libraries (default: all)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.library:
        run_library(args.library, args.out)
        return
    for library in args.only or LIBRARIES:  # one process each: the libraries patch the same functions
        cmd = [sys.executable, __file__, "--library", library, "--out", str(args.out)]
        subprocess.run(cmd, check=True, timeout=180)
        print(f"{library}: {args.out / (file_name(library) + '.otlp')}")


if __name__ == "__main__":
    main()
