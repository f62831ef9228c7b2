"""Capture the spans of LlamaIndex's conversational chat engines, whose question is first condensed by a model call
before the retrieval, under OpenInference's LlamaIndex and OpenAI instrumentors (capture_llamaindex.py's set-up and
versions), against the loopback stub of capture.py; write ``llamaindex_chat_<set-up>.otlp`` (capture.py's
``write_traces``) and ``llamaindex_chat_<set-up>.json`` (what the client saw), then print a span table.

The index is capture_llamaindex.py's (a ``VectorStoreIndex`` over its three documents, ``OpenAIEmbedding`` with
``embed_batch_size=1`` and llama-index's ``OpenAI`` LLM, both on the stub). Each request passes a chat history of
one earlier exchange, so the engine condenses the question with a model call before it retrieves (with an empty
history both engines skip that call): ``CondenseQuestionChatEngine`` by ``llm.predict`` (a chat call),
``CondensePlusContextChatEngine`` by ``llm.complete`` (a chat call too, for a chat model). Both are plain requests
to the stub, answered with its normal text, which becomes the retrieval's query; then the answering call (streaming
or not). A fresh engine per request (their memory keeps what they answered).

Cases, one trace each under a root span ``POST /ask`` (SERVER):

- ``condense_question_stream``: ``index.as_chat_engine(chat_mode="condense_question", streaming=True)``,
  ``.stream_chat(question, chat_history)``; the query engine inside streams the answer;
- ``condense_plus_context_stream``: ``chat_mode="condense_plus_context"``, ``.stream_chat(...)``;
- ``condense_question_chat`` and ``condense_plus_context_chat``: the same engines, ``.chat(...)`` (not streaming).

``stream_chat`` returns at once: LlamaIndex reads the model's stream in a thread of its own
(``write_response_to_history``, started with a copy of the caller's context) and the caller reads it from a queue
through ``response_gen``. ``called_ns`` is just before the engine is called, ``first_chunk_ns`` when the caller
gets the first non-empty item of ``response_gen``, ``answered_ns`` after its end (or after ``.chat`` returns);
``condense_done_ns`` is when LlamaIndex's own instrumentation tells the first model call's end (its first
``LLMChatEndEvent`` / ``LLMCompletionEndEvent``, a handler of the service's own); ``model_calls`` is what the stub
received during the request (each chat request's start and end on the stub, ``stream``, and whether the earlier
exchange was in its messages): two calls, the first a plain one carrying the history. One warm-up request per case
first, not written.

Set-ups, each in its own process (the instrumentors patch the same classes):

- ``openinference``: OpenInference's LlamaIndex and OpenAI instrumentors;
- ``openinference_helper``: both, and ttft-emit's helper on the LLM's client
  (``time_first_chunk(llm._get_client())``, from this repository's ``emitter/src``);
- ``openinference_llamaindex_only``: the LlamaIndex instrumentor alone (the OpenAI one uninstrumented).

    python3.11 -m venv /tmp/lichat
    /tmp/lichat/bin/pip install -r tests/data/otel_instrumentations/requirements-llamaindex.txt
    /tmp/lichat/bin/python tests/data/otel_instrumentations/capture_llamaindex_chat.py --out /tmp/lichat_out
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, write_capture, run_setups
import capture_llamaindex  # the documents and the distributions

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
KEYS = ("span.kind", "stream", "finish", "invocation_parameters", "first", "operation", "model_name")
#: Set-up -> (the OpenAI instrumentor on, ttft-emit's helper on the LLM's client).
SETUPS: dict[str, tuple[bool, bool]] = {
    "openinference": (True, False),
    "openinference_helper": (True, True),
    "openinference_llamaindex_only": (False, False),
}
#: Case -> (chat mode, streaming).
CASES: dict[str, tuple[str, bool]] = {
    "condense_question_stream": ("condense_question", True),
    "condense_plus_context_stream": ("condense_plus_context", True),
    "condense_question_chat": ("condense_question", False),
    "condense_plus_context_chat": ("condense_plus_context", False),
}
CHAT_HISTORY = (
    ("user", "Which river flows through Paris?"),
    ("assistant", "The Seine flows through Paris."),
)
HISTORY_MARK = "Which river flows through Paris?"
QUESTION = "And what is it the capital of?"

#: What the stub received: one dict per request (kind, stream, start_ns, end_ns, history).
REQUESTS: list[dict[str, Any]] = []
_REQUESTS_LOCK = threading.Lock()


class RecordingStub(capture.StubHandler):
    """capture.py's stub, noting each request it answers."""

    def do_POST(self) -> None:
        start_ns = time.time_ns()
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.rfile = io.BytesIO(raw)  # the stub reads the body again
        body = json.loads(raw or b"{}")
        super().do_POST()
        note = {
            "kind": "embeddings" if self.path.endswith("/embeddings") else "chat",
            "stream": bool(body.get("stream")),
            "start_ns": start_ns,
            "end_ns": time.time_ns(),
            "history": HISTORY_MARK in json.dumps(body.get("messages") or body.get("prompt") or ""),
        }
        with _REQUESTS_LOCK:
            REQUESTS.append(note)


def serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class ChatService:
    """The service: the index, and one chat engine per request."""

    def __init__(self, provider: Any, base_url: str, helper: bool) -> None:
        from llama_index.core import Document, Settings, VectorStoreIndex
        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler
        from llama_index.embeddings.openai import OpenAIEmbedding
        from llama_index.llms.openai import OpenAI

        embed_model = OpenAIEmbedding(
            model=capture.EMBEDDING_MODEL, api_base=base_url, api_key="stub-key", embed_batch_size=1, max_retries=0
        )
        self.llm = OpenAI(model=capture.MODEL, api_base=base_url, api_key="stub-key", max_retries=0)
        Settings.embed_model, Settings.llm = embed_model, self.llm
        if helper:  # the service's one line (docs/otlp-mapping.md, "The helper"), on the LLM's (reused) client
            from ttft_emit.otel import time_first_chunk

            time_first_chunk(self.llm._get_client(), tracer_provider=provider)
        docs = [Document(text=t) for t in capture_llamaindex.DOCS]
        self.index = VectorStoreIndex.from_documents(docs, embed_model=embed_model)
        self.tracer = provider.get_tracer("rag-llamaindex-chat")
        self.llm_ends: list[int] = []
        ends = self.llm_ends

        class LlmEnds(BaseEventHandler):
            def handle(self, event: Any, **kwargs: Any) -> Any:
                if type(event).__name__ in ("LLMChatEndEvent", "LLMCompletionEndEvent"):
                    ends.append(time.time_ns())

        get_dispatcher().add_event_handler(LlmEnds())

    def history(self) -> list[Any]:
        from llama_index.core.llms import ChatMessage

        return [ChatMessage(role=role, content=text) for role, text in CHAT_HISTORY]

    def call(self, case: str) -> dict[str, Any]:
        """One call of a fresh engine of ``case``; the client's times and what the stub received."""
        chat_mode, streaming = CASES[case]
        kwargs: dict[str, Any] = {"streaming": True} if streaming else {}
        engine = self.index.as_chat_engine(chat_mode=chat_mode, llm=self.llm, similarity_top_k=2, **kwargs)
        self.llm_ends.clear()
        with _REQUESTS_LOCK:
            REQUESTS.clear()
        answer, first_chunk_ns = "", None
        called_ns = time.time_ns()
        if streaming:
            response = engine.stream_chat(QUESTION, chat_history=self.history())
            for token in response.response_gen:
                if token and first_chunk_ns is None:
                    first_chunk_ns = time.time_ns()
                answer += token
        else:
            answer = str(engine.chat(QUESTION, chat_history=self.history()))
        answered_ns = time.time_ns()
        assert answer.strip() == "".join(capture.CHUNKS), answer
        with _REQUESTS_LOCK:
            calls = [dict(r) for r in REQUESTS if r["kind"] == "chat"]
            embeddings = sum(r["kind"] == "embeddings" for r in REQUESTS)
        calls.sort(key=lambda r: r["start_ns"])
        for c in calls:
            del c["kind"]
        # the condense call happened: two model calls, the first a plain one with the history, then the answer
        assert len(calls) == 2, calls
        assert not calls[0]["stream"] and calls[0]["history"], calls
        assert calls[1]["stream"] == streaming, calls
        assert calls[0]["end_ns"] <= calls[1]["start_ns"], calls
        return {
            "chat_mode": chat_mode,
            "called_ns": called_ns,
            "condense_done_ns": self.llm_ends[0] if self.llm_ends else None,
            "first_chunk_ns": first_chunk_ns,
            "answered_ns": answered_ns,
            "model_calls": calls,
            "embedding_requests": embeddings,
        }

    def ask(self, case: str) -> dict[str, Any]:
        """One request, a trace under ``POST /ask``; what the client saw."""
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            seen = self.call(case)
        trace_id = format(root.get_span_context().trace_id, "032x")
        streaming = CASES[case][1]
        return {"case": case, "trace_id": trace_id, "streaming": streaming, "retrieval_attempts": 1, **seen}


def run_setup(setup: str, out: Path) -> None:
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with_openai, helper = SETUPS[setup]
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-llamaindex-chat", "service.version": "1.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    if with_openai:
        OpenAIInstrumentor().instrument(tracer_provider=provider)
    sys.path.insert(0, str(EMITTER_SRC))  # ttft_emit for the helper; its egg-info gives its version
    server, base_url = serve()
    service = ChatService(provider, base_url, helper)
    for case in CASES:  # warm-up, not written
        service.call(case)
    provider.force_flush()
    exporter.clear()
    truth = [service.ask(case) for case in CASES]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    ids = {t["trace_id"] for t in truth}
    stray = [s.name for s in spans if format(s.context.trace_id, "032x") not in ids]
    if stray:
        print(f"# spans outside the traces: {stray}")
    versions = {name: metadata.version(name) for name in capture_llamaindex.DISTRIBUTIONS}
    if helper:
        versions["ttft-emit"] = metadata.version("ttft-emit")
    capture.write_capture(out, f"llamaindex_chat_{setup}", spans, truth, versions, KEYS, helper=helper)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "llamaindex_chat_", timeout_s=180)


if __name__ == "__main__":
    main()
