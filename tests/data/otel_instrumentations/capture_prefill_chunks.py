"""Capture the spans the OpenAI instrumentations export when the stream's first chunks carry no output: a real
provider's chunks sent before the first token. Against a loopback stub, as capture.py's service; write
``prefill_<set-up>.otlp`` (capture.py's ``write_traces``) and ``prefill_<set-up>.json`` (what the client saw) into
``--out`` (default: beside this file), then print a span table.

The stub (:class:`PrefillStubHandler`, a subclass of capture.py's ``StubHandler``) answers a streamed chat
completion with, right after the response headers,

1. Azure OpenAI's ``prompt_filter_results`` chunk: ``"choices": []`` and the prompt's content-filter verdicts, with
   Azure's empty ``id``, ``object`` and ``model`` and ``created: 0`` (Azure sends it once the prompt is filtered,
   before generation);
2. a role-only chunk, as OpenAI and many OpenAI-compatible servers send first: ``delta`` ``{"role": "assistant",
   "content": "", "refusal": null}``;

then, :data:`capture.FIRST_CHUNK_DELAY_S` later (so 120 ms after the early chunks), capture.py's content chunks
(:data:`capture.CHUNKS`, :data:`capture.CHUNK_GAP_S` apart; their deltas carry ``content`` only, no ``role``), the
finishing chunk, the usage chunk (``stream_options.include_usage``) and ``data: [DONE]``. Which early chunks it
sends is the server's ``early`` (:func:`serve`; :data:`EARLY_CHUNKS` by default, both): every set-up below sends both.
A plain call is answered as capture.py's stub does (after :data:`capture.NON_STREAM_DELAY_S`). The stub answers
OpenAI's paths (``/v1/chat/completions``, ``/v1/embeddings``) and Azure OpenAI's
(``/openai/deployments/<deployment>/chat/completions?api-version=...``, ``.../embeddings?api-version=...``): the
query is stripped before the path is matched (:data:`STUB_PATH`); any other path gets a 404. It counts each request
(method, path with its query, ``Host``, ``api-key`` or bearer) in ``server.requests``.

The service is capture.py's ``RagService`` (root ``POST /ask``, the library's retrieval spans around an embeddings
call, :data:`capture.PROMPT_WORK_S` of prompt work, the chat completion), three requests as capture.py's:
``stream``, ``non_stream``, ``retried``. What the client saw per trace (``<name>.json``): ``called_ns`` (just before
the call), ``first_any_chunk_ns`` (the first chunk of any kind the client got: the filter chunk),
``first_chunk_ns`` (the first chunk that carries content: ``choices`` non-empty and a ``delta.content`` non-empty;
what the user sees first), ``early_chunks`` (how many chunks came before it), ``answered_ns``. One warm-up call of
each kind first (no root span), not written.

Set-ups, each in its own process (the instrumentors patch the same client):

- ``openinference``, ``openllmetry``, ``openai_v2``: capture.py's ``instrument`` (:data:`capture.LIBRARIES`:
  OpenInference's, OpenLLMetry's and OpenTelemetry's openai-v2 ``OpenAIInstrumentor``);
- ``genai_openai``: OpenTelemetry's ``opentelemetry-instrumentation-genai-openai`` (the successor of openai-v2; its
  ``OpenAIInstrumentor``), which needs ``opentelemetry-util-genai`` 1.3b0 while openai-v2 2.4b0 needs 1.1b0: a
  second venv (``--python genai_openai=...``);
- ``azure_<library>`` (``azure_openinference``, ``azure_openllmetry``, ``azure_openai_v2``,
  ``azure_genai_openai``): the same instrumentation, but the service's client is the real ``openai.AzureOpenAI``
  configured as an Azure OpenAI user configures it (:func:`azure_client`, :class:`AzurePrefillRagService`, which
  replaces the ``openai.OpenAI`` capture.py's service builds, before the helper is applied)::

      openai.AzureOpenAI(azure_endpoint="https://ttft-rag.openai.azure.com", api_version="2024-10-21",
                         api_key="stub-key", max_retries=0,
                         http_client=httpx2.Client(transport=LoopbackTransport(port)))

  No ``azure_deployment``: the client puts each call's ``model`` (the deployment's name) into the path, so chat
  completions go to ``/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21`` and embeddings to
  the embeddings deployment, ``/openai/deployments/text-embedding-3-small/embeddings?api-version=2024-10-21``. The
  client and the instrumentations see the base URL ``https://ttft-rag.openai.azure.com/openai/``; the
  ``LoopbackTransport`` (an ``httpx2.BaseTransport``: ``httpx2`` is openai 3's HTTP library; ``httpx`` with an
  openai on it) sends every request, as a copy with scheme ``http``, host ``127.0.0.1`` and the stub's port (path,
  query and headers kept: ``Host`` stays the Azure host's), through an ``HTTPTransport``, so the only connections go
  to 127.0.0.1 and the Azure host's name is never resolved. :func:`guard_network` (an audit hook, in these set-ups'
  processes) counts every name lookup and connection by host and raises for any host but 127.0.0.1. The json has
  ``azure``: the client, endpoint, API version, base URL, HTTP client, the requests the stub got and the lookups and
  connections (``network``). ``--isolated`` runs each set-up in a network namespace of its own whose only interface
  is the loopback (``unshare -rn``, then ``ip link set lo up``): the captures work with no network. The stub's
  answers are the same as for the other set-ups. What names Azure on the LLM and the embeddings spans (openai
  3.63): OpenInference ``llm.provider = "azure"`` (``llm.system`` stays ``"openai"``); OpenLLMetry
  ``gen_ai.provider.name = "azure.ai.openai"``, ``gen_ai.openai.api_base`` (the base URL) and
  ``gen_ai.openai.api_version``; genai-openai only ``server.address`` (the Azure host; ``gen_ai.provider.name`` stays
  ``"openai"``); openai-v2 2.4b0 nothing (it reads the host only from an ``httpx.URL`` or a str base URL, and
  openai 3's is an ``httpx2.URL``: no ``server.address`` at all);
- ``<any of them>_helper``: the same, then ttft-emit's helper on the service's client,
  ``time_first_chunk(client, tracer_provider=provider)`` (from this repository's ``emitter/src``, put on
  ``sys.path``); the json with the helper's ``stats`` after the warm-up and at the end.

Venvs (``requirements-prefill.txt``: the first is ``requirements.txt``'s and its ``httpx2`` pins, the second its
``#genai`` lines); ``--python KEY=PATH`` runs the set-ups whose name, with or without ``azure_``, starts with KEY
with that interpreter::

    python3.11 -m venv /tmp/prefill
    /tmp/prefill/bin/pip install -r tests/data/otel_instrumentations/requirements-prefill.txt
    python3.11 -m venv /tmp/prefill_genai
    sed -n 's/^#genai //p' tests/data/otel_instrumentations/requirements-prefill.txt > /tmp/prefill_genai.txt
    /tmp/prefill_genai/bin/pip install -r /tmp/prefill_genai.txt
    /tmp/prefill/bin/python tests/data/otel_instrumentations/capture_prefill_chunks.py \\
        --python genai_openai=/tmp/prefill_genai/bin/python [--isolated] [--only azure_openinference ...]
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from dataclasses import asdict
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, instrument, RagService, write_capture, the timing constants

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASES = ("stream", "non_stream", "retried")
#: The instrumentation libraries: capture.py's three and OpenTelemetry's genai-openai.
LIBRARIES = (*capture.LIBRARIES, "genai_openai")
#: The prefix of the set-ups whose service uses ``openai.AzureOpenAI`` (:func:`azure_client`).
AZURE = "azure_"
SETUPS = tuple(
    f"{azure}{library}{helper}" for azure in ("", AZURE) for helper in ("", "_helper") for library in LIBRARIES
)
GENAI_OPENAI = ("opentelemetry-instrumentation-genai-openai", "opentelemetry.instrumentation.genai.openai")
KEYS = ("first", "token", "stream", "operation", "time_to", "span.kind", "finish", "response.model", "response.id")
#: Azure OpenAI as its users configure ``openai.AzureOpenAI``: the resource's endpoint and the API version; no
#: ``azure_deployment``, so the client puts each request's ``model`` (the deployment's name) into the path.
AZURE_ENDPOINT = "https://ttft-rag.openai.azure.com"
AZURE_API_VERSION = "2024-10-21"
#: Where every connection goes: the stub's address.
LOOPBACK = "127.0.0.1"
#: The paths the stub answers (its query stripped): OpenAI's and Azure OpenAI's.
STUB_PATH = re.compile(r"/v1/(?:chat/completions|embeddings)|/openai/deployments/[^/]+/(?:chat/completions|embeddings)")
#: The attribute names the span table also shows for an Azure set-up: what could tell Azure OpenAI.
AZURE_KEYS = ("provider", "system", "api_", "api.", "server.", "url.", "azure", "az.", "deployment")
#: The chunks the stub sends right after the headers, before the content: Azure's prompt filter results, the role.
EARLY_CHUNKS = ("prompt_filter", "role")
#: Azure OpenAI's verdict on the prompt (all four categories ``safe``).
PROMPT_FILTER_RESULTS = [
    {
        "prompt_index": 0,
        "content_filter_results": {
            name: {"filtered": False, "severity": "safe"} for name in ("hate", "self_harm", "sexual", "violence")
        },
    }
]


class PrefillStubHandler(capture.StubHandler):
    """capture.py's stub; a stream sends the server's ``early`` chunks with the headers, the content 120 ms later.
    It answers OpenAI's paths and Azure OpenAI's (:data:`STUB_PATH`, the query stripped), 404 otherwise, and counts
    each request (method, path with query, ``Host``, the key's header) in the server's ``requests``."""

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        requests = getattr(self.server, "requests", None)
        if requests is not None:
            auth = "api-key" if self.headers.get("api-key") else "bearer" if self.headers.get("Authorization") else "-"
            key = f"{self.command} {self.path} (Host: {self.headers.get('Host')}, {auth})"
            requests[key] = requests.get(key, 0) + 1
        if not STUB_PATH.fullmatch(url.path):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            raw = json.dumps({"error": {"code": "404", "message": "Resource not found"}}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        self.path = url.path  # capture.py's stub matches the path's end
        super().do_POST()

    def _stream(self, body: dict[str, Any]) -> None:
        early = getattr(self.server, "early", EARLY_CHUNKS)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if "prompt_filter" in early:  # Azure's: no choices, empty id / object / model
            self._event(
                {
                    "choices": [],
                    "created": 0,
                    "id": "",
                    "model": "",
                    "object": "",
                    "prompt_filter_results": PROMPT_FILTER_RESULTS,
                }
            )
        if "role" in early:
            delta = {"role": "assistant", "content": "", "refusal": None}
            self._event(self._chunk(body, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
        time.sleep(capture.FIRST_CHUNK_DELAY_S)
        for i, text in enumerate(capture.CHUNKS):
            if i:
                time.sleep(capture.CHUNK_GAP_S)
            self._event(self._chunk(body, [{"index": 0, "delta": {"content": text}, "finish_reason": None}]))
        self._event(self._chunk(body, [{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({**self._chunk(body, []), "usage": capture.USAGE})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def serve(early: tuple[str, ...] = EARLY_CHUNKS) -> tuple[ThreadingHTTPServer, str]:
    """The stub on loopback, sending ``early`` (of :data:`EARLY_CHUNKS`) before a stream's content."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), PrefillStubHandler)
    server.early = early  # type: ignore[attr-defined]
    server.requests = {}  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def has_content(chunk: Any) -> bool:
    """Whether a chunk carries content: a choice whose ``delta.content`` is not empty."""
    return any(getattr(getattr(c, "delta", None), "content", None) for c in (chunk.choices or []))


class PrefillRagService(capture.RagService):
    """capture.py's service; a stream's truth is its first chunk with content, and also its first chunk of any kind."""

    def call(self, streaming: bool) -> dict[str, Any]:
        messages: Any = [{"role": "user", "content": self.question}]
        seen: dict[str, Any] = {"called_ns": time.time_ns(), "first_any_chunk_ns": None, "first_chunk_ns": None}
        if streaming:
            early = 0
            stream = self.client.chat.completions.create(
                model=capture.MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
            )
            for chunk in stream:
                now = time.time_ns()
                if seen["first_any_chunk_ns"] is None:
                    seen["first_any_chunk_ns"] = now
                if seen["first_chunk_ns"] is None:
                    if has_content(chunk):
                        seen["first_chunk_ns"] = now
                    else:
                        early += 1
            seen["early_chunks"] = early
        else:
            self.client.chat.completions.create(model=capture.MODEL, messages=messages)
        seen["answered_ns"] = time.time_ns()
        return seen

    def ask(self, case: str) -> dict[str, Any]:
        from opentelemetry.trace import SpanKind

        streaming = case != "non_stream"
        attempts = 2 if case == "retried" else 1
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            for attempt in range(attempts):
                self.retrieve(attempt, last=attempt == attempts - 1)
            time.sleep(capture.PROMPT_WORK_S)
            seen = self.call(streaming)
        return {
            "case": case,
            "trace_id": format(root.get_span_context().trace_id, "032x"),
            "streaming": streaming,
            "retrieval_attempts": attempts,
            **seen,
        }


def azure_client(port: int) -> Any:
    """``openai.AzureOpenAI`` as an Azure user configures it (:data:`AZURE_ENDPOINT`, :data:`AZURE_API_VERSION`, an
    API key, no ``azure_deployment``), with an ``http_client`` whose transport sends every request to the stub on
    ``127.0.0.1:port``: the client and the instrumentations see ``https://ttft-rag.openai.azure.com/openai/`` as the
    base URL, the connection goes to loopback only (the transport never resolves the Azure host's name). The HTTP
    client is the ``openai`` client's own library: ``httpx2`` (openai 3), else ``httpx``."""
    import openai

    try:
        import httpx2 as httpx
    except ImportError:  # an openai on httpx
        import httpx  # type: ignore[no-redef]

    class LoopbackTransport(httpx.BaseTransport):  # type: ignore[misc,name-defined]
        """Every request to ``http://127.0.0.1:<port>``, its path and query kept (its headers too: ``Host`` stays
        the Azure host's), through an ``HTTPTransport``; the client's request itself is left as it was."""

        def __init__(self, port: int) -> None:
            self.port = port
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request: Any) -> Any:
            url = request.url.copy_with(scheme="http", host=LOOPBACK, port=self.port)
            loopback = httpx.Request(
                request.method, url, headers=request.headers, stream=request.stream, extensions=request.extensions
            )
            return self.inner.handle_request(loopback)

        def close(self) -> None:
            self.inner.close()

    return openai.AzureOpenAI(
        azure_endpoint=AZURE_ENDPOINT,
        api_version=AZURE_API_VERSION,
        api_key="stub-key",
        max_retries=0,
        http_client=httpx.Client(transport=LoopbackTransport(port)),
    )


class AzurePrefillRagService(PrefillRagService):
    """:class:`PrefillRagService` whose client is :func:`azure_client`'s ``openai.AzureOpenAI`` (replacing the
    ``openai.OpenAI`` capture.py's service builds): chat completions go to the deployment ``gpt-4o-mini``
    (:data:`capture.MODEL`), embeddings to ``text-embedding-3-small`` (:data:`capture.EMBEDDING_MODEL`)."""

    def __init__(self, library: str, provider: Any, port: int) -> None:
        super().__init__(library, provider, f"http://{LOOPBACK}:{port}/v1")
        self.client.close()
        self.client = azure_client(port)


def guard_network(seen: dict[str, int]) -> None:
    """An audit hook on this process: counts in ``seen`` each name lookup and connection (``socket.getaddrinfo``,
    ``socket.gethostbyname*``, ``socket.connect``, ``socket.sendto``) by host, and raises ``PermissionError`` for
    any host but ``127.0.0.1``: the Azure host is never resolved nor reached."""
    lookups = ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in lookups:
            host = args[0]
        elif event in ("socket.connect", "socket.sendto"):
            address = args[-1]
            if not isinstance(address, tuple):  # a Unix socket
                return
            host = address[0]
        else:
            return
        host = host.decode() if isinstance(host, bytes) else host
        key = f"{event} {host}"
        seen[key] = seen.get(key, 0) + 1
        if host not in (LOOPBACK, None):
            raise PermissionError(f"{event} {host!r}: this capture connects to {LOOPBACK} only")

    sys.addaudithook(hook)


def instrument(library: str, resource_attrs: dict[str, Any], processors: list[Any]) -> Any:
    """capture.py's ``instrument``; ``genai_openai``: OpenTelemetry's genai-openai ``OpenAIInstrumentor``."""
    if library in capture.LIBRARIES:
        return capture.instrument(library, resource_attrs, processors)
    import importlib

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create(resource_attrs))
    for processor in processors:
        provider.add_span_processor(processor)
    importlib.import_module(GENAI_OPENAI[1]).OpenAIInstrumentor().instrument(tracer_provider=provider)
    return provider


def versions(library: str, helper: bool, azure: bool = False) -> dict[str, str]:
    first = capture.LIBRARIES[library][0] if library in capture.LIBRARIES else GENAI_OPENAI[0]
    names = (
        first,
        "opentelemetry-util-genai",
        *capture.OTHER_DISTRIBUTIONS,
        *(("httpx2", "httpx") if azure else ()),
        *(("ttft-emit",) if helper else ()),
    )
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    if library in ("openinference", "openllmetry"):
        found.pop("opentelemetry-util-genai", None)  # installed for openai-v2, unused by these
    if azure and "httpx2" in found:
        found.pop("httpx", None)  # installed, unused: the client is on httpx2
    return found


def run_setup(setup: str, out: Path, early: tuple[str, ...] = EARLY_CHUNKS) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    helper = setup.endswith("_helper")
    azure = setup.startswith(AZURE)
    library = setup.removesuffix("_helper").removeprefix(AZURE)
    network: dict[str, int] = {}
    if azure:
        guard_network(network)
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-api", "service.version": "1.4.2", "tenant.id": capture.TENANT}
    provider = instrument(library, resource, [SimpleSpanProcessor(exporter)])
    server, base_url = serve(early)
    # capture.RagService picks the retrieval convention by its library: OpenInference's, else GenAI's.
    if azure:
        service: PrefillRagService = AzurePrefillRagService(library, provider, server.server_address[1])
    else:
        service = PrefillRagService(library, provider, base_url)
    timing = None
    if helper:  # the service's one line, after the instrumentor is set up
        sys.path.insert(0, str(EMITTER_SRC))
        from ttft_emit.otel import time_first_chunk

        timing = time_first_chunk(service.client, tracer_provider=provider)
    for streaming in (True, False):  # warm-up, not written
        service.call(streaming)
    warm = asdict(timing.stats) if timing is not None else None
    provider.force_flush()
    exporter.clear()
    truth = [service.ask(case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    name = f"prefill_{setup}"
    keys = (*KEYS, *AZURE_KEYS) if azure else KEYS
    capture.write_capture(
        out, name, spans, truth, versions(library, helper, azure), keys, helper=helper, timing=timing, warm=warm
    )
    if azure:  # how the client was set up, what the stub got, and every lookup and connection of the process
        doc = json.loads((out / f"{name}.json").read_text())
        client, http = type(service.client), type(service.client._client)
        doc["azure"] = {
            "client": f"{client.__module__}.{client.__qualname__}",
            "azure_endpoint": AZURE_ENDPOINT,
            "api_version": AZURE_API_VERSION,
            "base_url": str(service.client.base_url),
            "http_client": f"{http.__module__}.{http.__qualname__}",
            "transport": f"LoopbackTransport: each request to http://{LOOPBACK}:<the stub's port>, path and query kept",
            "stub_requests": dict(server.requests),  # type: ignore[attr-defined]
            "network": dict(network),
        }
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"# azure: {json.dumps(doc['azure'], indent=1)}")
    print(f"# early chunks: {list(early)}")
    for t in truth:
        if t["streaming"]:
            print(
                f"# {t['case']}: first chunk of any kind {(t['first_any_chunk_ns'] - t['called_ns']) / 1e6:.1f} ms,"
                f" first content chunk {(t['first_chunk_ns'] - t['called_ns']) / 1e6:.1f} ms after the call"
                f" ({t['early_chunks']} chunks before it)"
            )


def main() -> None:
    """capture.py's ``setup_main``: ``--python KEY=PATH`` picks the interpreter by the set-up's name with or without
    ``azure_`` (``genai_openai`` needs a venv of its own)."""
    capture.setup_main(
        __file__, __doc__, SETUPS, run_setup, OUT, "prefill_", python_keys=lambda s: (s, s.removeprefix(AZURE))
    )


if __name__ == "__main__":
    main()
