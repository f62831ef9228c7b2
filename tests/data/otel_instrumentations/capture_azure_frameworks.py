"""Capture the spans that LiteLLM's and LangChain's instrumentations export when the model is Azure OpenAI, whose
stream sends its ``prompt_filter_results`` chunk (``"choices": []``) and a role-only chunk right after the headers,
120 ms before the first content chunk. Against capture_prefill_chunks.py's loopback stub
(``PrefillStubHandler``, both early chunks; a plain call answered after :data:`capture.NON_STREAM_DELAY_S`);
write ``azure_<set-up>.otlp`` (capture.py's ``write_traces``) and ``azure_<set-up>.json`` (what the client saw)
into ``--out`` (default: beside this file), then print a span table.

Why: the OpenAI instrumentations of OpenInference, OpenLLMetry and genai-openai mark the stream's first chunk of any
kind (the filter chunk) as its first token (capture_prefill_chunks.py's ``azure_*``), and the pipeline ignores
those scopes' marks on an Azure span (``streams/core/otlp_conventions.py``: ``AZURE_FILTER_CHUNK_SCOPES``,
``is_azure_openai``). Here the same Azure stream reaches the caller through a framework, whose own instrumentation
(another scope) may mark it too.

Azure as its users configure it, every connection to 127.0.0.1 only: the client is the real ``openai.AzureOpenAI``
(openai 3) with the endpoint ``https://ttft-rag.openai.azure.com`` (:data:`capture_prefill_chunks.AZURE_ENDPOINT`),
API version ``2024-10-21``, an API key, and an ``httpx2.Client`` whose transport (capture_prefill_chunks.py's
``LoopbackTransport``, inside its ``azure_client``) sends each request to the stub on loopback, path, query and
headers kept; the Azure host's name is never resolved. capture_prefill_chunks.py's ``guard_network`` (an audit
hook) counts every name lookup and connection of the set-up's process and raises for any host but 127.0.0.1;
``--isolated`` runs each set-up in a network namespace whose only interface is the loopback (``unshare -rn``).
The json's ``azure`` says which client and HTTP client were used, the base URL, the requests the stub got and
the lookups and connections.

- LiteLLM (``litellm_*``): ``litellm.completion(model="azure/gpt-4o-mini", api_base=AZURE_ENDPOINT,
  api_version="2024-10-21", api_key="stub-key", client=<the AzureOpenAI above>, ...)``. LiteLLM's Azure provider
  (``litellm/llms/azure/azure.py``, ``AzureChatCompletion``) calls the client it is given
  (``get_azure_openai_client(client=...)`` returns it) with ``chat.completions.with_raw_response.create(**data)``
  (``make_sync_azure_openai_chat_completion_request``), so the ``model`` (the deployment) goes into the path:
  ``/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21``. (Without ``client=`` it builds an
  ``AzureOpenAI`` of its own, with ``http_client=litellm.client_session``.) Set-ups:

  - ``litellm_openinference``: openinference-instrumentation-litellm's ``LiteLLMInstrumentor``;
  - ``litellm_openinference_openai``: that and openinference-instrumentation-openai's ``OpenAIInstrumentor``;
  - ``litellm_openllmetry_openai``: OpenLLMetry's ``OpenAIInstrumentor`` only (it wraps
    ``Completions.create``, which ``with_raw_response.create`` calls);
  - ``litellm_openllmetry_litellm_openai``: OpenLLMetry's ``LiteLLMInstrumentor`` and ``OpenAIInstrumentor``;
  - ``<each>_helper``: the same, then ttft-emit's helper on the module, ``time_first_chunk(litellm,
    tracer_provider=provider)`` (as capture_litellm.py).

- LangChain (``langchain_*``): ``langchain_openai.AzureChatOpenAI(azure_endpoint=AZURE_ENDPOINT,
  api_version="2024-10-21", azure_deployment="gpt-4o-mini", api_key="stub-key", max_retries=0,
  http_client=<the httpx2.Client above>)``: it builds its own ``openai.AzureOpenAI`` with that HTTP client
  (``llm.root_client``; ``llm.client`` is its ``chat.completions``); one with ``streaming=True, stream_usage=True``
  for ``llm.stream(...)``, one without for ``llm.invoke(...)``. The deployment is in the base URL
  (``.../openai/deployments/gpt-4o-mini/``). Set-ups:

  - ``langchain_openinference``: openinference-instrumentation-langchain's ``LangChainInstrumentor`` alone;
  - ``langchain_openinference_openai``: that and OpenInference's ``OpenAIInstrumentor``;
  - ``langchain_openllmetry``: OpenLLMetry's ``LangchainInstrumentor`` alone;
  - ``langchain_openllmetry_openai``: that and OpenLLMetry's ``OpenAIInstrumentor``;
  - ``<each>_helper``: the same, then ``time_first_chunk(llm.root_client, tracer_provider=provider)`` on each
    model's client (as capture_langchain.py).

Three requests per set-up, each a trace with a root span ``POST /ask`` (SERVER), a retrieval span of the
set-up's convention (OpenInference ``RETRIEVER``, else ``gen_ai.operation.name = retrieval``) around
:data:`RETRIEVAL_S` of vector search, :data:`capture.PROMPT_WORK_S` of prompt work no library traces, then the
call: ``stream``, ``non_stream``, ``stream_2`` (a second stream). One call of each kind first, outside any request
(not written): a process's first LiteLLM call spends ~0.5 s in lazy imports. What the client saw per trace, as
capture_prefill_chunks.py: ``called_ns`` (just before the call), ``first_any_chunk_ns`` (the first chunk of any
kind the framework handed the caller), ``first_chunk_ns`` (the first with content: LiteLLM's first choice's
``delta.content``, LangChain's ``AIMessageChunk.content`` non-empty; what the user sees first), ``early_chunks``
(how many chunks the caller got before it), ``answered_ns``; and the stub's side (:class:`TimedStubHandler`):
``sent_filter_chunk_ns`` and ``sent_first_content_ns``, when the stub wrote the filter chunk and the first content
chunk.

What they export (litellm 1.110.2, langchain-openai 1.8.1, openai 3.63.0; OpenInference litellm 0.1.51, langchain
0.1.80, openai 0.1.66; OpenLLMetry 0.62.4). Both frameworks hand the caller the two early chunks (LiteLLM as chunks
without content, LangChain as empty ``AIMessageChunk`` objects), 120 ms before the first content. No framework
instrumentation marks a first chunk: OpenInference's LiteLLM ``completion`` and LangChain ``AzureChatOpenAI`` spans,
OpenLLMetry's ``litellm.chat`` and ``AzureChatOpenAI.chat`` have no first-chunk event or attribute. The only mark is
OpenInference's OpenAI ``ChatCompletion`` span's ``First Token Stream Event``, at the filter chunk (under LiteLLM and
LangChain alike), which the Azure rule ignores (``llm.provider = "azure"``): those streams are ``no_first_chunk``, none
is stored early. Every LLM span names Azure: OpenInference ``llm.provider = "azure"`` (LiteLLM's without ``llm.system``;
LangChain's also ``metadata`` with ``"ls_provider": "azure"``), OpenLLMetry ``gen_ai.provider.name = "azure.ai.openai"``
(its LangChain span also ``traceloop.association.properties.ls_provider = "azure"``; its OpenAI span also
``gen_ai.openai.api_base`` and ``gen_ai.openai.api_version``). OpenLLMetry's LangChain and LiteLLM instrumentations
suppress its OpenAI span under theirs (no ``openai.chat`` span in ``langchain_openllmetry_openai`` and
``litellm_openllmetry_litellm_openai``). OpenLLMetry's LangChain span does not tell whether the call streamed: a plain
``invoke`` is ``no_first_chunk`` too. Under LiteLLM, OpenLLMetry's OpenAI ``openai.chat`` span
(``litellm_openllmetry_openai``) ends 4-6 ms after its start, when ``with_raw_response`` returns (``gen_ai.headers`` has
``X-Stainless-Raw-Response``; the stream is not wrapped): ttft-emit's helper finds it ended at the first chunk
(``errors``), so that set-up stays ``no_first_chunk`` with it. With OpenInference's LangChain instrumentor alone the
helper on the client matches no span (``unmatched``: the ``AzureChatOpenAI`` span gets its ``openinference.span.kind``
only when it ends). Every other ``_helper`` set-up is ``complete``, its ``ttft_emit.time_to_first_chunk`` at the first
content chunk.

Venvs (``requirements-azure-frameworks.txt``): capture_litellm.py's (``requirements-litellm.txt``) and
capture_langchain.py's (``requirements-langchain.txt``), each with openai 3.63's ``httpx2`` 2.17.0 pinned;
ttft-emit from this repository's ``emitter/src`` (put on ``sys.path``). ``--python KEY=PATH`` runs the set-ups whose
name starts with KEY with that interpreter::

    python3.11 -m venv /tmp/llm
    /tmp/llm/bin/pip install -r tests/data/otel_instrumentations/requirements-azure-frameworks.txt
    python3.11 -m venv /tmp/lc
    /tmp/lc/bin/pip install -r tests/data/otel_instrumentations/requirements-langchain.txt httpx2==2.17.0 \\
        httpcore2==2.17.0
    python3.11 tests/data/otel_instrumentations/capture_azure_frameworks.py \\
        --python litellm=/tmp/llm/bin/python --python langchain=/tmp/lc/bin/python [--isolated] [--only ...]
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # write_capture, retrieval_span, the timing constants
import capture_prefill_chunks as prefill  # the stub, azure_client (its LoopbackTransport), guard_network

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = ("stream", "non_stream", "stream_2")
PREFIX = "azure_"
QUESTION = capture.RagService.question
#: The vector search inside the retrieval span.
RETRIEVAL_S = 0.050
#: How long the process runs on after the requests, before the flush (LiteLLM's logging threads).
SETTLE_S = 0.5
#: LiteLLM's model: its Azure provider and the deployment's name.
LITELLM_MODEL = f"azure/{capture.MODEL}"

OI_LITELLM = ("openinference-instrumentation-litellm", "openinference.instrumentation.litellm", "LiteLLMInstrumentor")
OI_LANGCHAIN = (
    "openinference-instrumentation-langchain",
    "openinference.instrumentation.langchain",
    "LangChainInstrumentor",
)
OI_OPENAI = ("openinference-instrumentation-openai", "openinference.instrumentation.openai", "OpenAIInstrumentor")
OL_LITELLM = ("opentelemetry-instrumentation-litellm", "opentelemetry.instrumentation.litellm", "LiteLLMInstrumentor")
OL_LANGCHAIN = (
    "opentelemetry-instrumentation-langchain",
    "opentelemetry.instrumentation.langchain",
    "LangchainInstrumentor",
)
OL_OPENAI = ("opentelemetry-instrumentation-openai", "opentelemetry.instrumentation.openai", "OpenAIInstrumentor")


@dataclass(frozen=True)
class Setup:
    #: ``litellm`` or ``langchain``.
    framework: str
    #: (distribution, module, class) of each instrumentor, instrumented with our tracer provider, in this order.
    instrumentors: tuple[tuple[str, str, str], ...]
    #: The retrieval span's convention: ``openinference`` or ``genai``.
    convention: str
    #: ttft-emit's helper on the framework's client (LiteLLM: the module; LangChain: each model's root client).
    helper: bool = False
    #: The helper's ``fill_missing``: its own LLM span where the call's ended before its first chunk.
    fill: bool = False


_BASE: dict[str, Setup] = {
    "litellm_openinference": Setup("litellm", (OI_LITELLM,), "openinference"),
    "litellm_openinference_openai": Setup("litellm", (OI_LITELLM, OI_OPENAI), "openinference"),
    "litellm_openllmetry_openai": Setup("litellm", (OL_OPENAI,), "genai"),
    "litellm_openllmetry_litellm_openai": Setup("litellm", (OL_LITELLM, OL_OPENAI), "genai"),
    "langchain_openinference": Setup("langchain", (OI_LANGCHAIN,), "openinference"),
    "langchain_openinference_openai": Setup("langchain", (OI_LANGCHAIN, OI_OPENAI), "openinference"),
    "langchain_openllmetry": Setup("langchain", (OL_LANGCHAIN,), "genai"),
    "langchain_openllmetry_openai": Setup("langchain", (OL_LANGCHAIN, OL_OPENAI), "genai"),
}
SETUPS: dict[str, Setup] = {
    f"{name}{suffix}": Setup(s.framework, s.instrumentors, s.convention, helper=bool(suffix))
    for name, s in _BASE.items()
    for suffix in ("", "_helper")
}
SETUPS["litellm_openllmetry_openai_fill"] = Setup("litellm", (OL_OPENAI,), "genai", helper=True, fill=True)
#: Distributions whose versions are recorded, by framework (with the set-up's instrumentors').
DISTRIBUTIONS = {
    "litellm": ("litellm", "openinference-instrumentation", "openinference-semantic-conventions"),
    "langchain": ("langchain-core", "langchain-openai", "openinference-instrumentation"),
}
COMMON = (
    "openai",
    "httpx2",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-semantic-conventions-ai",
    "opentelemetry-exporter-otlp-proto-common",
)
#: The attribute names the span table shows: timing, stream, and what could tell Azure OpenAI.
KEYS = (*prefill.KEYS, *prefill.AZURE_KEYS, "litellm", "ls_", "invocation", "model")


class TimedStubHandler(prefill.PrefillStubHandler):
    """capture_prefill_chunks.py's stub; also logs when it writes each stream's chunks (``server.sent``: the wall
    time just before the write, and ``filter`` for the chunk with no choices, ``content`` for one whose delta has
    content, else ``other``)."""

    def _event(self, doc: dict[str, Any]) -> None:
        now = time.time_ns()  # before the write: the client may read the chunk before this thread runs again
        super()._event(doc)
        choices = doc.get("choices") or []
        if "prompt_filter_results" in doc and not choices:
            kind = "filter"
        elif any((c.get("delta") or {}).get("content") for c in choices):
            kind = "content"
        else:
            kind = "other"
        sent = getattr(self.server, "sent", None)
        if sent is not None:
            sent.append((now, kind))


def serve() -> ThreadingHTTPServer:
    """The stub on loopback (both early chunks), logging what it sends (:class:`TimedStubHandler`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), TimedStubHandler)
    server.early = prefill.EARLY_CHUNKS  # type: ignore[attr-defined]
    server.requests = {}  # type: ignore[attr-defined]
    server.sent = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Service:
    """``ask(case)``: one request, a trace under a root span ``POST /ask``; ``call(streaming)``: the framework's
    call and what the caller saw. Subclasses: :class:`LiteLLMService`, :class:`LangChainService`."""

    def __init__(self, setup: Setup, tracer: Any, server: ThreadingHTTPServer) -> None:
        self.setup, self.tracer, self.server = setup, tracer, server

    def chunks(self) -> Any:
        """The streamed call's chunks, as the caller iterates them."""
        raise NotImplementedError

    def plain(self) -> None:
        raise NotImplementedError

    def has_content(self, chunk: Any) -> bool:
        raise NotImplementedError

    def call(self, streaming: bool) -> dict[str, Any]:
        seen: dict[str, Any] = {"called_ns": time.time_ns(), "first_any_chunk_ns": None, "first_chunk_ns": None}
        if streaming:
            early = 0
            for chunk in self.chunks():
                now = time.time_ns()
                if seen["first_any_chunk_ns"] is None:
                    seen["first_any_chunk_ns"] = now
                if seen["first_chunk_ns"] is None:
                    if self.has_content(chunk):
                        seen["first_chunk_ns"] = now
                    else:
                        early += 1
            seen["early_chunks"] = early
        else:
            self.plain()
        seen["answered_ns"] = time.time_ns()
        return seen

    def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        streaming = case != "non_stream"
        sent: list[tuple[int, str]] = self.server.sent  # type: ignore[attr-defined]
        sent.clear()
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            with capture.retrieval_span(self.tracer, self.setup.convention, QUESTION):
                time.sleep(RETRIEVAL_S)
            time.sleep(capture.PROMPT_WORK_S)
            seen = self.call(streaming)
        first_sent = {kind: next((t for t, k in sent if k == kind), None) for kind in ("filter", "content")}
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": streaming,
            "started_ns": root.start_time,
            **seen,
            "sent_filter_chunk_ns": first_sent["filter"],
            "sent_first_content_ns": first_sent["content"],
        }


class LiteLLMService(Service):
    """``litellm.completion(model="azure/gpt-4o-mini", ..., client=<AzureOpenAI>)``."""

    def __init__(self, setup: Setup, tracer: Any, server: ThreadingHTTPServer) -> None:
        super().__init__(setup, tracer, server)
        self.client = prefill.azure_client(server.server_address[1])

    def kwargs(self, stream: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": LITELLM_MODEL,
            "messages": [{"role": "user", "content": QUESTION}],
            "api_base": prefill.AZURE_ENDPOINT,
            "api_version": prefill.AZURE_API_VERSION,
            "api_key": "stub-key",
            "client": self.client,
            "timeout": 10.0,
            "max_retries": 0,
        }
        if stream:
            kwargs.update(stream=True, stream_options={"include_usage": True})
        return kwargs

    def chunks(self) -> Any:
        import litellm

        return litellm.completion(**self.kwargs(stream=True))

    def plain(self) -> None:
        import litellm

        litellm.completion(**self.kwargs(stream=False))

    def has_content(self, chunk: Any) -> bool:
        choices = getattr(chunk, "choices", None) or []
        return bool(choices and getattr(getattr(choices[0], "delta", None), "content", None))

    def clients(self) -> list[Any]:
        return [self.client]


class LangChainService(Service):
    """``AzureChatOpenAI`` (one streaming, one not) with the loopback HTTP client: ``llm.stream`` /
    ``llm.invoke``."""

    def __init__(self, setup: Setup, tracer: Any, server: ThreadingHTTPServer) -> None:
        from langchain_openai import AzureChatOpenAI

        super().__init__(setup, tracer, server)
        # capture_prefill_chunks.py's AzureOpenAI's HTTP client: an httpx2.Client with its LoopbackTransport
        http_client = prefill.azure_client(server.server_address[1])._client
        common: dict[str, Any] = {
            "azure_endpoint": prefill.AZURE_ENDPOINT,
            "api_version": prefill.AZURE_API_VERSION,
            "azure_deployment": capture.MODEL,
            "api_key": "stub-key",
            "max_retries": 0,
            "http_client": http_client,
        }
        self.llm_stream = AzureChatOpenAI(**common, streaming=True, stream_usage=True)
        self.llm_plain = AzureChatOpenAI(**common)

    def chunks(self) -> Any:
        return self.llm_stream.stream(QUESTION)

    def plain(self) -> None:
        self.llm_plain.invoke(QUESTION)

    def has_content(self, chunk: Any) -> bool:
        return bool(chunk.content)

    def clients(self) -> list[Any]:
        return [self.llm_stream.root_client, self.llm_plain.root_client]


def versions(setup: Setup) -> dict[str, str]:
    names = (*DISTRIBUTIONS[setup.framework], *(d for d, _, _ in setup.instrumentors), *COMMON)
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    if setup.helper:  # from the source tree (its egg-info, on sys.path)
        import ttft_emit

        found["ttft-emit"] = getattr(ttft_emit, "__version__", None) or metadata.version("ttft-emit")
    return found


def run_setup(name: str, out: Path) -> None:
    setup = SETUPS[name]
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no fetch of the cost map at import
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")  # no .env loaded at import
    network: dict[str, int] = {}
    prefill.guard_network(network)

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for _, module, cls in setup.instrumentors:
        getattr(importlib.import_module(module), cls)().instrument(tracer_provider=provider)
    server = serve()
    tracer = provider.get_tracer("rag-api")
    service: LiteLLMService | LangChainService
    if setup.framework == "litellm":
        service = LiteLLMService(setup, tracer, server)
    else:
        service = LangChainService(setup, tracer, server)
    timing = None
    if setup.helper:  # the service's line, after the instrumentors
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        if setup.framework == "litellm":
            import litellm

            timing = time_first_chunk(litellm, tracer_provider=provider, fill_missing=setup.fill)
        else:
            for client in service.clients():
                timing = time_first_chunk(client, tracer_provider=provider, fill_missing=setup.fill)
    for streaming in (True, False):  # warm-up, not written
        service.call(streaming)
    time.sleep(SETTLE_S)
    warm = asdict(timing.stats) if timing is not None else None
    provider.force_flush()
    exporter.clear()
    truth = [service.ask(case) for case in CASES]
    time.sleep(SETTLE_S)
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    file = f"{PREFIX}{name}"
    capture.write_capture(out, file, spans, truth, versions(setup), KEYS, helper=setup.helper, timing=timing, warm=warm)
    doc = json.loads((out / f"{file}.json").read_text())
    client = service.clients()[0]
    http = type(client._client)
    doc["framework"] = setup.framework
    doc["instrumentors"] = [f"{module}.{cls}" for _, module, cls in setup.instrumentors]
    doc["azure"] = {
        "client": f"{type(client).__module__}.{type(client).__qualname__}",
        "azure_endpoint": prefill.AZURE_ENDPOINT,
        "api_version": prefill.AZURE_API_VERSION,
        "base_url": str(client.base_url),
        "http_client": f"{http.__module__}.{http.__qualname__}",
        "transport": f"LoopbackTransport: each request to http://{prefill.LOOPBACK}:<the stub's port>, path and "
        "query kept",
        "stub_requests": dict(server.requests),  # type: ignore[attr-defined]
        "network": dict(network),
    }
    (out / f"{file}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"# azure: {json.dumps(doc['azure'], indent=1)}")
    for t in truth:
        if t["streaming"]:
            c = t["called_ns"]
            ms = lambda ns, c=c: "-" if ns is None else f"{(ns - c) / 1e6:.1f}"  # noqa: E731
            print(
                f"# {t['case']} (ms after the call): stub sent the filter chunk {ms(t['sent_filter_chunk_ns'])}, the"
                f" first content chunk {ms(t['sent_first_content_ns'])}; the caller got a first chunk"
                f" {ms(t['first_any_chunk_ns'])}, the first with content {ms(t['first_chunk_ns'])}"
                f" ({t['early_chunks']} before it)"
            )


def main() -> None:
    """capture.py's ``setup_main`` (``--python KEY=PATH`` by the set-up's name, ``--isolated``)."""
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, PREFIX)


if __name__ == "__main__":
    main()
