"""ttft-emit's first-token mark (``ttft_emit.otel_marks``): a zero-length span ``ttft.stage = first_token`` at the
first item of the caller's stream that hands it text, in the request's trace; the items unchanged. Here, not in
emitter/tests: it needs OpenTelemetry's SDK (see test_ttft_emit_otel.py). The live check is the DSPy capture
``dspy_openinference_marked`` (test_otlp_agent_frameworks.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ttft_emit.otel_marks import STAGE_ATTR, caller_text, first_token_marked, mark_first_token


@dataclass
class StatusMessage:  # DSPy's status item: no text for the caller
    message: str


@dataclass
class StreamResponse:  # DSPy's: the listened field's text
    predict_name: str
    signature_field_name: str
    chunk: str


@dataclass
class AIMessageChunk:  # LangChain's, as LangGraph's stream_mode="messages" gives it (with metadata)
    content: Any
    type: str = "AIMessageChunk"
    tool_call_chunks: list[Any] = field(default_factory=list)


@dataclass
class ToolMessage:
    content: str
    type: str = "tool"


ITEMS: list[Any] = [
    StatusMessage("Calling tool lookup_capital..."),
    StreamResponse("predict", "answer", ""),
    StreamResponse("predict", "answer", "Paris"),
    StreamResponse("predict", "answer", " is"),
    "a final prediction",
]


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return provider, exported


class Stream:
    """A stream that records when each item was handed out and whether it was closed."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.handed_ns, self.closed = items, [], False

    def __iter__(self) -> Iterator[Any]:
        return self._gen()

    def _gen(self) -> Iterator[Any]:
        try:
            for item in self.items:
                time.sleep(0.002)
                self.handed_ns.append(time.time_ns())
                yield item
        finally:
            self.closed = True


class AsyncStream(Stream):
    def __aiter__(self) -> AsyncIterator[Any]:
        return self._agen()

    async def _agen(self) -> AsyncIterator[Any]:
        try:
            for item in self.items:
                await asyncio.sleep(0.002)
                self.handed_ns.append(time.time_ns())
                yield item
        finally:
            self.closed = True


def _marker(exported: InMemorySpanExporter) -> tuple[ReadableSpan, ReadableSpan]:
    spans = exported.get_finished_spans()
    (root,) = [s for s in spans if s.name == "POST /ask"]
    (marker,) = [s for s in spans if s.name != "POST /ask"]
    return root, marker


def _check(root: ReadableSpan, marker: ReadableSpan, stream: Stream) -> None:
    assert (marker.attributes or {})[STAGE_ATTR] == "first_token"
    assert marker.start_time == marker.end_time
    assert marker.parent is not None and marker.parent.span_id == root.context.span_id
    assert marker.context.trace_id == root.context.trace_id
    # at the third item ("Paris"): after the stream handed it, before the fourth
    assert stream.handed_ns[2] <= int(marker.start_time or 0) < stream.handed_ns[3]


def test_sync_stream_marks_the_first_text_item_in_the_current_trace() -> None:
    provider, exported = _provider()
    stream = Stream(ITEMS)
    with provider.get_tracer("rag-api").start_as_current_span("POST /ask"):
        got = list(first_token_marked(stream, tracer_provider=provider))
    assert got == ITEMS
    _check(*_marker(exported), stream)


def test_async_stream_marks_the_first_text_item_in_the_current_trace() -> None:
    provider, exported = _provider()
    stream = AsyncStream(ITEMS)

    async def consume() -> list[Any]:
        with provider.get_tracer("rag-api").start_as_current_span("POST /ask"):
            return [item async for item in first_token_marked(stream, tracer_provider=provider)]

    assert asyncio.run(consume()) == ITEMS
    _check(*_marker(exported), stream)


def test_a_caller_that_stops_early_closes_the_stream_and_marks_once() -> None:
    provider, exported = _provider()
    stream = Stream([*ITEMS, *ITEMS])
    marked = first_token_marked(stream, tracer_provider=provider)
    for item in marked:
        if item == "a final prediction":
            break
    marked.close()  # type: ignore[attr-defined]
    assert stream.closed
    assert len(exported.get_finished_spans()) == 1


def test_no_text_no_mark_and_a_failing_predicate_or_provider_never_reaches_the_service() -> None:
    provider, exported = _provider()
    assert list(first_token_marked(iter(ITEMS[:2]), tracer_provider=provider)) == ITEMS[:2]

    def boom(item: Any) -> bool:
        raise RuntimeError("predicate")

    assert list(first_token_marked(iter(ITEMS), boom, tracer_provider=provider)) == ITEMS
    assert exported.get_finished_spans() == ()

    class Broken:
        def get_tracer(self, name: str) -> Any:
            raise RuntimeError("provider")

    assert list(first_token_marked(iter(ITEMS), tracer_provider=Broken())) == ITEMS
    mark_first_token(Broken())  # nothing raised


@pytest.mark.parametrize(
    ("item", "text"),
    [
        ("", False),
        ("Paris", True),
        (StreamResponse("p", "answer", "Paris"), True),
        (StreamResponse("p", "answer", ""), False),
        (StatusMessage("Calling tool"), False),
        ((AIMessageChunk("Paris"), {"langgraph_node": "agent"}), True),
        ((AIMessageChunk(""), {"langgraph_node": "agent"}), False),  # a tool call's chunk
        ((AIMessageChunk([{"type": "text", "text": "Paris"}]), {}), True),  # content blocks
        ((AIMessageChunk([{"type": "tool_use", "input": "{"}]), {}), False),
        ((ToolMessage("Paris"), {"langgraph_node": "tools"}), False),  # a tool's result: not the answer
        (None, False),
    ],
)
def test_caller_text(item: Any, text: bool) -> None:
    assert caller_text(item) is text


def test_mark_at_a_given_time() -> None:
    provider, exported = _provider()
    mark_first_token(provider, at_ns=1_700_000_000_000_000_000)
    (span,) = exported.get_finished_spans()
    assert span.start_time == span.end_time == 1_700_000_000_000_000_000
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "ttft_emit.otel"
