"""Capture the spans of a conversational LangChain RAG service, whose question is first condensed by a model call,
under the LangChain instrumentations of OpenInference and OpenLLMetry (capture_langchain.py's, unmodified), against
the loopback stub of capture.py; write ``conversational_<set-up>.otlp`` (capture.py's ``write_traces``) and
``conversational_<set-up>.json`` (what the client saw), then print a span table.

The chain is LangChain's conversational retrieval: ``create_history_aware_retriever(llm, retriever,
contextualize_prompt)`` (with a non-empty chat history its branch runs ``contextualize_prompt | llm |
StrOutputParser() | retriever``: the condense call's output is the retriever's query), then
``create_retrieval_chain(history_aware_retriever, create_stuff_documents_chain(llm, qa_prompt))``. The model, the
retriever (BM25 and a vector store in an ``EnsembleRetriever``) and the instrumentors are capture_langchain.py's;
the same ``ChatOpenAI(streaming=True)`` condenses and answers, so both calls are streaming requests to the stub
(LangChain streams the branch too when the chain is streamed), each answered with the stub's normal chunks.

Set-ups, each in its own process (the instrumentors patch the same classes), as capture_langchain.py's streaming
cases, plus ttft-emit's helper (``time_first_chunk(llm.root_client)``, from this repository's ``emitter/src``) for
each family:

- ``openinference``: OpenInference's LangChain and OpenAI instrumentors;
- ``openinference_langchain_only``: its LangChain instrumentor alone (the OpenAI one uninstrumented);
- ``openinference_helper``: both, and the helper;
- ``openllmetry``: OpenLLMetry's LangChain and OpenAI instrumentors;
- ``openllmetry_helper``: both, and the helper.

One case, ``conversational_stream``: a trace with a root span ``POST /ask`` (SERVER) around ``chain.stream(...)``
with a chat history of one earlier exchange. ``called_ns`` is just before the chain is called, ``first_chunk_ns``
when the service gets the first non-empty ``answer`` text, ``answered_ns`` after the stream's end;
``condense_done_ns`` is when LangChain's callbacks tell the first model call's end (a handler of the service's own
in the call's config). One warm-up request first, not written.

    python3.11 -m venv /tmp/lcconv
    /tmp/lcconv/bin/pip install -r tests/data/otel_instrumentations/requirements-langchain.txt
    /tmp/lcconv/bin/python tests/data/otel_instrumentations/capture_conversational.py --out /tmp/conv_out
"""

from __future__ import annotations

import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture  # the stub, write_traces, print_spans
import capture_langchain  # the instrumentors, the model and the retriever

OUT = Path(__file__).resolve().parent
EMITTER_SRC = OUT.parents[2] / "emitter" / "src"
CASE = "conversational_stream"
KEYS = ("first", "token", "stream", "operation", "span.kind", "model", "llm.system", "request.type", "invocation")
#: Set-up -> (library, its OpenAI instrumentor on, ttft-emit's helper on the model's client).
SETUPS: dict[str, tuple[str, bool, bool]] = {
    "openinference": ("openinference", True, False),
    "openinference_langchain_only": ("openinference", False, False),
    "openinference_helper": ("openinference", True, True),
    "openllmetry": ("openllmetry", True, False),
    "openllmetry_helper": ("openllmetry", True, True),
}
CHAT_HISTORY = (
    ("human", "Which river flows through Paris?"),
    ("ai", "The Seine flows through Paris."),
)
QUESTION = "And what is it the capital of?"


class ConversationalRag:
    """The service: capture_langchain's model and retriever in LangChain's conversational retrieval chain."""

    def __init__(self, provider: Any, base_url: str, helper: bool) -> None:
        from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
        from langchain_classic.chains.combine_documents import create_stuff_documents_chain
        from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
        from langchain_openai import ChatOpenAI

        rag = capture_langchain.LangChainRag(provider, base_url)
        llm = rag.chain(True, helper).steps[-2]  # its streaming ChatOpenAI (on the helper or not)
        assert isinstance(llm, ChatOpenAI), llm
        contextualize_prompt = ChatPromptTemplate.from_messages(
            [
                ("system", "Rewrite the latest question as a standalone question, given the chat history."),
                MessagesPlaceholder("chat_history"),
                ("human", "{input}"),
            ]
        )
        qa_prompt = ChatPromptTemplate.from_messages(
            [
                ("system", "Answer the question from this context:\n\n{context}"),
                MessagesPlaceholder("chat_history"),
                ("human", "{input}"),
            ]
        )
        history_aware_retriever = create_history_aware_retriever(llm, rag.retriever, contextualize_prompt)
        self.chain = create_retrieval_chain(history_aware_retriever, create_stuff_documents_chain(llm, qa_prompt))
        self.tracer = rag.tracer

    def call(self) -> dict[str, Any]:
        """One call of the chain; the client's times."""
        from langchain_core.callbacks import BaseCallbackHandler

        seen: dict[str, int | None] = {"condense_done_ns": None, "first_chunk_ns": None}

        class CondenseEnd(BaseCallbackHandler):
            def on_llm_end(self, response: Any, **kwargs: Any) -> None:
                if seen["condense_done_ns"] is None:
                    seen["condense_done_ns"] = time.time_ns()

        inputs = {"input": QUESTION, "chat_history": list(CHAT_HISTORY)}
        answer = ""
        called_ns = time.time_ns()
        for part in self.chain.stream(inputs, config={"callbacks": [CondenseEnd()]}):
            text = part.get("answer")
            if text and seen["first_chunk_ns"] is None:
                seen["first_chunk_ns"] = time.time_ns()
            answer += text or ""
        answered_ns = time.time_ns()
        assert answer == "".join(capture.CHUNKS), answer
        return {"called_ns": called_ns, **seen, "answered_ns": answered_ns}

    def ask(self) -> dict[str, Any]:
        """One request, a trace under ``POST /ask``; what the client saw."""
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER) as root:
            seen = self.call()
        trace_id = format(root.get_span_context().trace_id, "032x")
        return {"case": CASE, "trace_id": trace_id, "streaming": True, "retrieval_attempts": 1, **seen}


def run_setup(setup: str, out: Path) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    library, with_openai, helper = SETUPS[setup]
    exporter = InMemorySpanExporter()
    resource = {"service.name": "rag-langchain", "service.version": "2.0.0", "tenant.id": capture.TENANT}
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    openai_instrumentor = capture_langchain.instrument(library, provider)
    if not with_openai:
        openai_instrumentor.uninstrument()
    sys.path.insert(0, str(EMITTER_SRC))  # ttft_emit for the helper; its egg-info gives its version
    server, base_url = capture.serve()
    service = ConversationalRag(provider, base_url, helper)
    service.call()  # warm-up, not written
    exporter.clear()
    truth = [service.ask()]
    server.shutdown()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    versions = capture_langchain.versions(library)
    if helper:
        versions["ttft-emit"] = metadata.version("ttft-emit")
    capture.write_capture(out, f"conversational_{setup}", spans, truth, versions, KEYS, helper=helper)


def main() -> None:
    capture.setup_main(__file__, __doc__, SETUPS, run_setup, OUT, "conversational_", timeout_s=180)


if __name__ == "__main__":
    main()
