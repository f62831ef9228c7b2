"""The streams ttft-emit's OpenTelemetry helper hands back: they time their first chunk of output.

A streaming response of an LLM client is iterated by the caller; :class:`TimedStream` wraps it and calls back
once, when the first chunk *of output* comes out (:func:`is_output`). Most clients stream chunks of the answer
(OpenAI chat completions, Gemini responses): the first one counts. Clients that stream typed events first send
events that carry no token: Anthropic's ``message_start``, ``content_block_start`` and ``ping``, the OpenAI
Responses API's ``response.created`` and ``response.in_progress`` (sent when the request is accepted, a whole
queue and prefill before the first token). There the first ``content_block_delta`` or ``*.delta`` event counts.

:class:`TimedStreamManager` wraps a stream helper's manager (``client.messages.stream(...)`` of the anthropic
client): entering it sends the request, and the stream it returns reads a raw event stream that every way of
consuming it goes through (iterating, ``text_stream``, ``until_done``, ``get_final_message``), so that raw
stream is the one timed. Instrumentations wrap the same attribute (OpenInference's Anthropic instrumentor
intercepts ``_raw_stream`` the same way).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

#: The typed stream events that carry output: Anthropic's, and (by suffix) the OpenAI Responses API's.
OUTPUT_EVENT_TYPES = frozenset({"content_block_delta"})
OUTPUT_EVENT_SUFFIX = ".delta"


#: What a chat-completions chunk's ``choices[].delta`` carries when it is output (the legacy completions API:
#: ``choices[].text``).
OUTPUT_DELTA_FIELDS = ("content", "tool_calls", "function_call", "refusal", "reasoning_content", "reasoning")


def is_output(chunk: Any) -> bool:
    """Whether a streamed item carries output: a typed event (a string ``type``) only when it is a delta
    (:data:`OUTPUT_EVENT_TYPES`, or a type ending in ``.delta``); a chat-completions chunk (``choices``; Mistral's
    event holds it as ``data``) only when a choice's delta carries some (:data:`OUTPUT_DELTA_FIELDS`), not a chunk
    with the role alone or no choices (Azure OpenAI's ``prompt_filter_results`` first); any other untyped chunk does
    (a chunk of the answer)."""
    kind = getattr(chunk, "type", None)
    if isinstance(kind, str):
        return kind in OUTPUT_EVENT_TYPES or kind.endswith(OUTPUT_EVENT_SUFFIX)
    choices = getattr(chunk, "choices", None)
    if choices is None:
        choices = getattr(getattr(chunk, "data", None), "choices", None)
    if not isinstance(choices, list):
        return True
    for choice in choices:
        delta = getattr(choice, "delta", None)
        if getattr(choice, "text", None) or any(getattr(delta, name, None) for name in OUTPUT_DELTA_FIELDS):
            return True
    return False


def is_bedrock_output(event: Any) -> bool:
    """Whether an event of a Bedrock stream (boto3's ``EventStream``: one-key dicts) carries output: a
    ``contentBlockDelta`` (``converse_stream``), or a ``chunk`` (``invoke_model_with_response_stream``) whose
    model's JSON is an output event by :func:`is_output`'s rule (Anthropic's ``content_block_delta``) or untyped
    (other models' chunks carry text). ``messageStart``, ``contentBlockStart``, ``messageStop`` and ``metadata``
    do not."""
    if not isinstance(event, dict):
        return True
    if "contentBlockDelta" in event:
        return True
    chunk = event.get("chunk")
    if not isinstance(chunk, dict):
        return False
    try:
        doc = json.loads(chunk.get("bytes") or b"null")
    except (TypeError, ValueError):
        return True
    kind = doc.get("type") if isinstance(doc, dict) else None
    return not isinstance(kind, str) or kind in OUTPUT_EVENT_TYPES or kind.endswith(OUTPUT_EVENT_SUFFIX)


class TimedStream:
    """A streaming response that calls ``on_first`` once, when its first chunk of output (``output``, by default
    :func:`is_output`) comes out; iterates (sync or async), enters, exits and closes as the wrapped stream does,
    and proxies every other attribute."""

    def __init__(
        self,
        stream: Any,
        on_first: Callable[[], None],
        on_end: Callable[[], None] | None = None,
        output: Callable[[Any], bool] = is_output,
    ) -> None:
        self._stream = stream
        self._output = output
        self._on_first: Callable[[], None] | None = on_first
        #: Called once when the stream ends: exhausted, failed, closed or exited (the helper's own span ends).
        self._on_end = on_end
        self._iterator: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        """The wrapped stream's class, as wrapt's proxies answer: a framework's ``isinstance(stream,
        openai.AsyncStream)`` holds (Semantic Kernel 1.45 checks it twice on its streaming path, and failed every
        streamed call under the helper). ``type()`` still tells the wrapper."""
        return type(self._stream)

    def _seen(self, chunk: Any) -> None:
        if self._on_first is None or not self._output(chunk):
            return
        on_first, self._on_first = self._on_first, None
        on_first()

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    def __iter__(self) -> TimedStream:
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        try:
            chunk = next(self._iterator)
        except BaseException:
            self._ended()
            raise
        self._seen(chunk)
        return chunk

    def __aiter__(self) -> TimedStream:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        try:
            chunk = await self._iterator.__anext__()
        except BaseException:
            self._ended()
            raise
        self._seen(chunk)
        return chunk

    def close(self) -> Any:
        self._ended()
        close = getattr(self._stream, "close", None)
        return close() if close is not None else None

    def __enter__(self) -> TimedStream:
        enter = getattr(self._stream, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc: Any) -> Any:
        exit_ = getattr(self._stream, "__exit__", None)
        try:
            return exit_(*exc) if exit_ is not None else None
        finally:
            self._ended()

    async def __aenter__(self) -> TimedStream:
        enter = getattr(self._stream, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        exit_ = getattr(self._stream, "__aexit__", None)
        try:
            return await exit_(*exc) if exit_ is not None else None
        finally:
            self._ended()


def time_raw_stream(stream: Any, on_first: Callable[[], None], on_end: Callable[[], None] | None = None) -> Any:
    """``stream`` (what a stream manager's enter returned) timed: its raw event stream wrapped in place when it
    has one (``_raw_stream``, read lazily by every way of consuming it), else ``stream`` itself wrapped."""
    raw = getattr(stream, "_raw_stream", None)
    if raw is None:
        return TimedStream(stream, on_first, on_end)
    try:
        stream._raw_stream = TimedStream(raw, on_first, on_end)
    except Exception:  # a stream that refuses the attribute: iterating it is still timed
        return TimedStream(stream, on_first, on_end)
    return stream


class TimedRawResponse:
    """The raw response of a streaming call made through a Stainless client's ``with_streaming_response`` or
    ``with_raw_response`` (the OpenAI Agents SDK streams with ``client.responses.with_streaming_response.create``):
    the stream its ``parse()`` returns (awaited, for an async client) is a :class:`TimedStream`; closing or exiting
    the response ends it too. Reading the body another way (``iter_lines``, ``iter_bytes``) is not timed."""

    def __init__(self, response: Any, on_first: Callable[[], None], on_end: Callable[[], None] | None = None) -> None:
        self._response = response
        self._on_first = on_first
        self._on_end = on_end
        self._parsed: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        """The wrapped response's class (:attr:`TimedStream.__class__`)."""
        return type(self._response)

    def _timed(self, stream: Any) -> Any:
        if self._parsed is None or self._parsed._stream is not stream:
            self._parsed = TimedStream(stream, self._on_first, self._on_end)
        return self._parsed

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        parsed = self._response.parse(*args, **kwargs)
        if inspect.isawaitable(parsed):
            return self._parsed_later(parsed)
        return self._timed(parsed)

    async def _parsed_later(self, pending: Any) -> Any:
        return self._timed(await pending)

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    def close(self) -> Any:
        try:
            closed = self._response.close()
        except BaseException:
            self._ended()
            raise
        if inspect.isawaitable(closed):
            return self._closed_later(closed)
        self._ended()
        return closed

    async def _closed_later(self, pending: Any) -> Any:
        try:
            return await pending
        finally:
            self._ended()


class TimedStreamManager:
    """A stream helper's manager (``with client.messages.stream(...) as stream``): ``enter`` (a context
    manager the helper gives) runs around entering the wrapped manager, so spans started as the request is
    sent are matched to the call; the stream it returns is timed (:func:`time_raw_stream`)."""

    def __init__(
        self,
        manager: Any,
        enter: Callable[[], Any],
        on_first: Callable[[], None],
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self._manager = manager
        self._enter = enter
        self._on_first = on_first
        #: Called when the stream ends, and again (a no-op then) when the manager exits: a stream left unread.
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        """The wrapped manager's class (:attr:`TimedStream.__class__`)."""
        return type(self._manager)

    def __enter__(self) -> Any:
        with self._enter():
            stream = self._manager.__enter__()
        return time_raw_stream(stream, self._on_first, self._on_end)

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self._manager.__exit__(*exc)
        finally:
            self._ended()

    def _ended(self) -> None:
        if self._on_end is not None:
            self._on_end()

    async def __aenter__(self) -> Any:
        with self._enter():
            stream = await self._manager.__aenter__()
        return time_raw_stream(stream, self._on_first, self._on_end)

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self._manager.__aexit__(*exc)
        finally:
            self._ended()


__all__ = ["TimedRawResponse", "TimedStream", "TimedStreamManager", "is_bedrock_output", "is_output", "time_raw_stream"]
