"""The caller's first token, marked in the trace, where the model's first chunk is not it.

Some frameworks stream text the caller never sees before the text it does: DSPy streams its field markers
(``[[ ## answer ## ]]``) and, in ``ReAct``'s extract step, the ``reasoning`` field before the field a
``StreamListener`` hands over; smolagents streams its answer as a ``final_answer`` tool call. Timing the model's
first chunk (the instrumentations, :func:`ttft_emit.otel.time_first_chunk`) then measures something earlier than
what the user waits for. ttft-pipeline's OTLP input takes the first token from a span with
``ttft.stage = first_token`` when a trace has one (docs/otlp-mapping.md), so the service marks it where it sees it:

.. code-block:: python

    from ttft_emit.otel_marks import first_token_marked

    stream = dspy.streamify(program, stream_listeners=[StreamListener(signature_field_name="answer")])
    async for item in first_token_marked(stream(question=question)):
        ...  # unchanged: the same items, in the same order

:func:`first_token_marked` wraps an iterator or async iterator and, at the first item :func:`caller_text` (or the
``is_token`` given) calls text, starts and ends a zero-length span ``first token`` with ``ttft.stage =
first_token`` in the caller's current context (so in the request's trace, under the span current there).
:func:`mark_first_token` is the same mark for a service that finds its first token itself.

Uses the OpenTelemetry API only (imported when a mark is made). Never raises into the service: a mark that fails
is skipped, the items still flow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Final, TypeVar, overload

log = logging.getLogger("ttft_emit.otel")

#: The span attribute that names a span's stage for ttft-pipeline.
STAGE_ATTR: Final = "ttft.stage"
#: The marker span's name.
FIRST_TOKEN_SPAN: Final = "first token"
#: The tracer's (instrumentation scope's) name.
SCOPE: Final = "ttft_emit.otel"

T = TypeVar("T")


def mark_first_token(tracer_provider: Any = None, at_ns: int | None = None) -> None:
    """A zero-length span ``ttft.stage = first_token`` at ``at_ns`` (default: now, wall clock ns), child of the
    current span; ``tracer_provider`` defaults to the global one."""
    try:
        from opentelemetry import trace

        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        at = time.time_ns() if at_ns is None else at_ns
        span = provider.get_tracer(SCOPE).start_span(
            FIRST_TOKEN_SPAN, start_time=at, attributes={STAGE_ATTR: "first_token"}
        )
        span.end(end_time=at)
    except Exception:  # never into the service
        log.debug("first token mark failed", exc_info=True)


def caller_text(item: Any) -> bool:
    """Whether a streamed item hands the caller text: a non-empty ``str``; a DSPy ``StreamResponse`` (its
    ``chunk``); a LangChain AI message chunk with text content (also as LangGraph's ``(chunk, metadata)`` pairs of
    ``stream_mode="messages"``). Anything else (status messages, the final ``Prediction``, tool calls and tool
    results) is not."""
    if isinstance(item, tuple) and item:
        item = item[0]
    if isinstance(item, str):
        return bool(item)
    chunk = getattr(item, "chunk", None)
    if isinstance(chunk, str):
        return bool(chunk)
    if getattr(item, "type", None) in ("AIMessageChunk", "ai"):
        return _has_text(getattr(item, "content", None))
    return False


def _has_text(content: Any) -> bool:
    """LangChain message content: a string, or a list of strings and ``{"type": "text", "text": ...}`` blocks."""
    if isinstance(content, str):
        return bool(content)
    if isinstance(content, list):
        return any(
            bool(part) if isinstance(part, str) else isinstance(part, dict) and bool(part.get("text"))
            for part in content
        )
    return False


@overload
def first_token_marked(
    stream: AsyncIterable[T], is_token: Callable[[T], bool] = ..., tracer_provider: Any = ...
) -> AsyncIterator[T]: ...


@overload
def first_token_marked(
    stream: Iterable[T], is_token: Callable[[T], bool] = ..., tracer_provider: Any = ...
) -> Iterator[T]: ...


def first_token_marked(
    stream: Iterable[T] | AsyncIterable[T], is_token: Callable[[T], bool] = caller_text, tracer_provider: Any = None
) -> Iterator[T] | AsyncIterator[T]:
    """``stream``'s items unchanged; the first one ``is_token`` accepts is marked (:func:`mark_first_token`)
    when the caller receives it, before it is handed on."""
    if isinstance(stream, AsyncIterable):
        return _marked_async(stream, is_token, tracer_provider)
    return _marked(stream, is_token, tracer_provider)


def _accepts(is_token: Callable[[T], bool], item: T) -> bool:
    try:
        return bool(is_token(item))
    except Exception:  # a predicate's error is not the service's
        log.debug("is_token failed", exc_info=True)
        return False


def _marked(stream: Iterable[T], is_token: Callable[[T], bool], provider: Any) -> Iterator[T]:
    items = iter(stream)
    try:
        for item in items:
            if _accepts(is_token, item):
                mark_first_token(provider)
                yield item
                break
            yield item
        yield from items
    finally:  # a caller that stops early closes the stream too (an HTTP response, a generator)
        close = getattr(items, "close", None)
        if callable(close):
            close()


async def _marked_async(stream: AsyncIterable[T], is_token: Callable[[T], bool], provider: Any) -> AsyncIterator[T]:
    items = stream.__aiter__()
    marked = False
    try:
        async for item in items:
            if not marked and _accepts(is_token, item):
                marked = True
                mark_first_token(provider)
            yield item
    finally:
        close = getattr(items, "aclose", None)
        if callable(close):
            await close()
