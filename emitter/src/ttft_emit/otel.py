"""The first chunk on the LLM span, for OpenTelemetry instrumentations that record none (or the wrong one).

Some instrumentations of LLM clients end the span of a streaming call when the stream ends and record
nothing about its first chunk, or do not say whether the call streamed (``opentelemetry-instrumentation-openai-v2``
2.4b0; the Anthropic and Google Gen AI instrumentations of OpenInference and OpenLLMetry; OpenLLMetry on the OpenAI
Responses API), or mark a first chunk that carries no token (OpenInference on the Responses API marks
``response.created``). ttft-pipeline's OTLP input then cannot measure the call's time to first token: it
stores the request as ``no_first_chunk`` (docs/otlp-mapping.md). The smallest change a team can make, with
no change to the instrumentation:

.. code-block:: python

    from ttft_emit.otel import time_first_chunk

    client = openai.OpenAI()  # or anthropic.Anthropic(), google.genai.Client(), boto3's bedrock-runtime, litellm
    time_first_chunk(client, tracer_provider=provider)  # once, after the instrumentor is set up

Each generating call of the client (:data:`CLIENT_METHODS`) then sets, on the LLM span the instrumentation
starts for it,

- ``gen_ai.request.stream`` (bool) when the span starts, from the call's ``stream`` argument (or the method: a
  stream helper, ``generate_content_stream``): a plain call is mapped as not streaming (its whole duration is
  the time to first token);
- ``gen_ai.response.time_to_first_chunk`` (seconds, GenAI semantic conventions >= 1.41) when the first chunk
  *of output* of a streaming response reaches the caller: the wall time since the span's start. Typed events
  that carry no token (Anthropic's ``message_start``, the Responses API's ``response.created``) do not count
  (:func:`ttft_emit.otel_streams.is_output`). The same value also as ``ttft_emit.time_to_first_chunk``
  (:data:`OWN_FIRST_CHUNK_ATTR`), which the pipeline reads first: an instrumentation may overwrite the GenAI one.

How: :meth:`FirstChunkTiming.wrap` wraps a ``create`` method (sync or async; any client whose streaming is
a ``stream=True`` keyword) so that, for the duration of the call, spans started in the caller's context are
offered to :meth:`FirstChunkTiming.span_processor` (an SDK ``SpanProcessor``, added to the tracer
provider), which picks the call's first LLM span (``gen_ai.operation.name`` ``chat`` / ``text_completion``
/ ``generate_content``, or OpenInference kind ``LLM``); when the call starts none, the caller's: the current
span if it is an LLM span (a service's own GenAI span around the call), else the LLM span last started in the
caller's context while it still records (OpenLLMetry's LangChain instrumentation starts ``ChatOpenAI.chat``
from a callback, does not make it current, and suppresses the client's span); for a streaming call that matched
none, the first span started inside it if it still records at the first chunk (OpenLIT names its LLM span only
when the stream ends). A streaming response is handed back wrapped: it
iterates (``for`` / ``async for``), closes and proxies attributes as the original does, and times its first
chunk.

Never raises into the service: a call without a matching span, a span already ended, or an attribute the
SDK refuses is counted in :attr:`FirstChunkTiming.stats` and the call goes on unchanged. Costs one context
variable set per call and one attribute per first chunk. Imports ``opentelemetry-sdk`` only when
:meth:`FirstChunkTiming.span_processor` is called: the rest of ttft-emit never imports OpenTelemetry.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from ttft_emit.otel_streams import TimedRawResponse, TimedStream, TimedStreamManager, is_bedrock_output

#: The GenAI semantic conventions' time to first chunk of a streamed response, in seconds.
FIRST_CHUNK_ATTR: Final = "gen_ai.response.time_to_first_chunk"
#: The same value under the helper's own name, which the pipeline reads first: an instrumentation may overwrite the
#: GenAI attribute after the helper set it (util-genai 1.3b0 writes its first server event's time when the stream
#: ends: ``response.created`` on the Responses API, 120 ms before the first token).
OWN_FIRST_CHUNK_ATTR: Final = "ttft_emit.time_to_first_chunk"
#: Whether the request streamed (GenAI semantic conventions).
STREAM_ATTR: Final = "gen_ai.request.stream"
#: The header Stainless clients (openai, anthropic) add to a call made through ``with_streaming_response`` or
#: ``with_raw_response``: the call returns the raw response, whose ``parse()`` gives the stream.
RAW_RESPONSE_HEADER: Final = "X-Stainless-Raw-Response"
#: ``gen_ai.operation.name`` values of an LLM inference span.
LLM_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content"})


@dataclass(frozen=True)
class FirstChunkStats:
    """What the helper did: ``calls`` wrapped, ``spans`` matched to a call, ``first_chunks`` set on a span;
    ``unmatched`` calls that started no LLM span in the caller's context (nothing set), ``errors`` swallowed
    (the SDK refused an attribute, a span without a start time)."""

    calls: int
    spans: int
    first_chunks: int
    unmatched: int
    errors: int
    #: Calls that started no LLM span at all, given the helper's own (``fill_missing``).
    filled: int = 0


class _Call:
    """One wrapped call: whether it streams, the LLM span the processor matched to it (if any), and the span
    that was current when it was made (the framework's LLM span, when the client's own is suppressed)."""

    __slots__ = (
        "caller",
        "context",
        "filler",
        "first_started",
        "model",
        "raw",
        "result_key",
        "span",
        "started",
        "started_ns",
        "stream",
    )

    def __init__(self, stream: bool, model: Any = None, result_key: str | None = None) -> None:
        self.stream = stream
        self.model = model
        #: The key of a streaming result's stream, when the result is a dict holding it (boto3's Bedrock calls).
        self.result_key = result_key
        #: Made through ``with_streaming_response`` / ``with_raw_response``: the result is the raw response.
        self.raw = False
        self.span: Any = None
        self.caller: Any = None
        #: The first span started inside the call, whatever its attributes (OpenLIT names its LLM span only
        #: when the call ends).
        self.first_started: Any = None
        #: The spans started inside the call (up to :data:`_STARTED_KEPT`), and when and in which context the
        #: call was made: kept only when the helper fills in missing LLM spans.
        self.started: list[Any] = []
        self.started_ns = 0
        self.context: Any = None
        #: The helper's own LLM span for the call (:meth:`FirstChunkTiming.fill_missing_spans`), until it ends.
        self.filler: Any = None


_CALL: ContextVar[_Call | None] = ContextVar("ttft_emit_otel_call", default=None)
#: The spans last started in this context outside a wrapped call, newest first: a framework's LLM span among
#: them, which it may not make current and may name an LLM span only after its start (OpenLLMetry's LangChain
#: instrumentation starts ``ChatOpenAI.chat`` from a callback and suppresses the client's span under it).
_STARTED: ContextVar[tuple[Any, ...]] = ContextVar("ttft_emit_otel_started", default=())
#: How many of them are kept.
_STARTED_KEPT: Final = 8


def is_llm_span(attributes: Any) -> bool:
    """Whether a span's start attributes name an LLM inference (GenAI operation or OpenInference kind)."""
    if attributes is None:
        return False
    operation, kind = attributes.get("gen_ai.operation.name"), attributes.get("openinference.span.kind")
    return operation in LLM_OPERATIONS or kind == "LLM"


#: Where OpenInference's span proxy (``OpenInferenceSpan``, openinference-instrumentation 0.1.72) keeps the
#: attributes it writes onto the span only when the span ends: ``openinference.span.kind`` among them. Its Haystack
#: instrumentor sets the kind of ``OpenAIChatGenerator.run`` after the span started, so the span said nothing while
#: the call ran, and the helper found no LLM span to time.
_HELD_ATTRIBUTES: Final = "_self_important_attributes"


def names_llm_call(span: Any) -> bool:
    """Whether ``span`` names an LLM inference by now (:func:`is_llm_span`), counting the attributes an
    OpenInference span proxy holds until its end."""
    if is_llm_span(getattr(span, "attributes", None)):
        return True
    held = getattr(span, _HELD_ATTRIBUTES, None)
    return isinstance(held, Mapping) and is_llm_span(held)


#: Instrumentation scopes whose LLM span names its kind only when it ends: OpenInference's LangChain tracer (0.1.80)
#: starts a run's span with its name alone and sets every attribute from the run at its end, so under it alone (no
#: instrumentor of the client) the helper matched no span. The newest span of such a scope still recording in the
#: caller's context and naming no kind yet (the chat model's run, started just before the client call) is taken.
KIND_AT_END_SCOPES: Final = frozenset({"openinference.instrumentation.langchain"})


def names_kind_at_end(span: Any) -> bool:
    """Whether ``span`` is of a :data:`KIND_AT_END_SCOPES` scope and names no kind yet."""
    scope = getattr(getattr(span, "instrumentation_scope", None), "name", None)
    if scope not in KIND_AT_END_SCOPES:
        return False
    attributes = getattr(span, "attributes", None) or {}
    return "openinference.span.kind" not in attributes and "gen_ai.operation.name" not in attributes


class FirstChunkTiming:
    """Sets the first chunk (and whether the call streamed) on the LLM spans of wrapped client calls.

    One instance per process is enough: :meth:`span_processor` goes into the tracer provider once, and
    :meth:`wrap` (or :meth:`instrument`) wraps each client's ``create``. Thread- and task-safe: a call's
    state lives in a context variable, so concurrent calls on threads or asyncio tasks never mix.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"calls": 0, "spans": 0, "first_chunks": 0, "unmatched": 0, "errors": 0, "filled": 0}
        self._processor: Any = None
        #: The tracer of the helper's own LLM spans (:meth:`fill_missing_spans`); None: it makes none.
        self._tracer: Any = None

    @property
    def stats(self) -> FirstChunkStats:
        """A snapshot of the counters."""
        with self._lock:
            return FirstChunkStats(**self._counts)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def span_processor(self) -> Any:
        """The SDK ``SpanProcessor`` that matches a wrapped call's LLM span when it starts and sets
        ``gen_ai.request.stream`` on it (the same object on every call). Add it to the tracer provider:
        ``provider.add_span_processor(timing.span_processor())``. Needs ``opentelemetry-sdk``."""
        if self._processor is None:
            from opentelemetry.sdk.trace import SpanProcessor

            timing = self

            class _FirstChunkSpanProcessor(SpanProcessor):  # type: ignore[misc]
                def on_start(self, span: Any, parent_context: Any = None) -> None:
                    timing._on_span_start(span)

            self._processor = _FirstChunkSpanProcessor()
        return self._processor

    def _on_span_start(self, span: Any) -> None:
        call = _CALL.get()
        if call is None:
            _STARTED.set((span, *_STARTED.get()[: _STARTED_KEPT - 1]))
            return
        if call.span is not None:
            return
        try:
            if call.first_started is None:
                call.first_started = span
            if self._tracer is not None and len(call.started) < _STARTED_KEPT:
                call.started.append(span)
            if not is_llm_span(getattr(span, "attributes", None)):
                return
            call.span = span
            self._count("spans")
            span.set_attribute(STREAM_ATTR, call.stream)
        except Exception:  # never into the instrumentation, and so never into the service
            self._count("errors")

    def _first_chunk(self, call: _Call) -> None:
        span = call.span
        if span is None:
            span = self._still_streaming(call)
        if span is None and self._tracer is not None and call.filler is None:
            # Its LLM span named itself only when it ended, with the response headers (OpenInference's Groq
            # instrumentor, 0.1.33): the helper's own, which holds it.
            span = self._fill(call, replacing=True)
        if span is None:
            self._count("unmatched")
            return
        if not span.is_recording():
            span = self._open_caller(call) or span
        if self._tracer is not None and call.filler is None and not span.is_recording():
            # Ended before its stream's first chunk (Logfire's span ends with the response headers): the helper's own.
            span = self._fill(call, replacing=True) or span
        try:
            now_ns = time.time_ns()  # the SDK stamps a span's start with time.time_ns() too
            start_ns = getattr(span, "start_time", None)
            if not isinstance(start_ns, int) or not span.is_recording():
                self._count("errors")
                return
            seconds = max(now_ns - start_ns, 0) / 1e9
            span.set_attribute(FIRST_CHUNK_ATTR, seconds)
            span.set_attribute(OWN_FIRST_CHUNK_ATTR, seconds)
            self._count("first_chunks")
        except Exception:
            self._count("errors")

    def _open_caller(self, call: _Call) -> Any:
        """The caller's LLM span, if it still records, for a call whose own span ended before its stream's first
        chunk (OpenInference's OpenAI span of a ``with_streaming_response`` call ends with the response headers,
        inside the OpenAI Agents SDK's ``response`` span): marked as streaming. The pipeline then counts the outer
        span, which tells the first chunk, and drops the inner one, which does not (docs/otlp-mapping.md)."""
        span = call.caller
        try:
            if span is None or span is call.span or not span.is_recording():
                return None
            if not names_llm_call(span):
                return None
            span.set_attribute(STREAM_ATTR, True)
        except Exception:
            self._count("errors")
            return None
        return span

    def _still_streaming(self, call: _Call) -> Any:
        """A streaming call that matched no LLM span: the first span started inside it, if it still records at the
        first chunk and names no other operation (an HTTP client's span ended with the response headers; OpenLIT's
        LLM span, which names itself only when the stream ends, runs on). Marked as streaming, counted matched."""
        span = call.first_started
        try:
            if span is None or not span.is_recording():
                return None
            attributes = getattr(span, "attributes", None) or {}
            named = "gen_ai.operation.name" in attributes or "openinference.span.kind" in attributes
            if named and not is_llm_span(attributes):  # says it is something else (an embeddings call)
                return None
            call.span = span
            self._count("spans")
            span.set_attribute(STREAM_ATTR, True)
        except Exception:
            self._count("errors")
            return None
        return span

    def _caller_span(self) -> Any:
        """The caller's LLM span, if any, once the helper's processor is set up: the current span when it is one,
        else the newest span started in the caller's context that records and now names an LLM call, else the newest
        that will name its kind only when it ends (:data:`KIND_AT_END_SCOPES`)."""
        if self._processor is None:
            return None
        try:
            from opentelemetry import trace

            current = trace.get_current_span()
            if names_llm_call(current):
                return current
            later = None  # a span that will name its kind when it ends (KIND_AT_END_SCOPES)
            for span in _STARTED.get():
                if not span.is_recording():
                    continue
                if is_llm_span(getattr(span, "attributes", None)):
                    return span
                if later is None and names_kind_at_end(span):
                    later = span
        except Exception:
            return None
        return later

    def _adopt_caller(self, call: _Call) -> None:
        """No LLM span started inside the call: take the caller's (:meth:`_caller_span`) while it records. A
        service's own GenAI span around the call, or a framework's LLM span under which the client's own span is
        suppressed (OpenLLMetry's LangChain instrumentation)."""
        span = call.caller
        if call.span is not None or span is None:
            return
        try:
            if not span.is_recording() or not (names_llm_call(span) or names_kind_at_end(span)):
                return
            call.span = span
            self._count("spans")
            span.set_attribute(STREAM_ATTR, call.stream)
        except Exception:
            self._count("errors")

    def _finished(self, call: _Call, result: Any) -> Any:
        self._adopt_caller(call)
        self._fill(call)
        if not call.stream:
            if call.filler is not None:
                self._end_filler(call)
            elif call.span is None:
                self._count("unmatched")
            return result
        on_first, on_end = (lambda: self._first_chunk(call)), (lambda: self._end_filler(call))
        key = call.result_key
        if key is None:
            if call.raw:  # the stream is what the raw response's parse() returns
                return TimedRawResponse(result, on_first, on_end)
            return TimedStream(result, on_first, on_end)
        if isinstance(result, dict) and key in result:  # boto3: {"stream": EventStream, ...}
            result[key] = TimedStream(result[key], on_first, on_end, is_bedrock_output)
        return result

    def fill_missing_spans(self, tracer_provider: Any) -> None:
        """From now on, a wrapped call that started no LLM span at all (its instrumentation does not cover the
        method: openai-v2 2.4b0 and the Responses API), or whose LLM span ended before its stream's first chunk
        (Logfire 5.4 ends it with the response headers), gets the helper's own: ``chat <model>`` (CLIENT,
        ``gen_ai.operation.name = chat``, ``gen_ai.request.model``, ``gen_ai.request.stream``), a child of the
        span current at the call, from the call's start to its answer or its stream's end, with its first chunk."""
        self._tracer = tracer_provider.get_tracer("ttft_emit.otel")

    def _fill(self, call: _Call, replacing: bool = False) -> Any:
        """The helper's own LLM span for ``call`` (:meth:`fill_missing_spans`), if it is on and the call started no
        LLM span (none of the spans started inside it names one by now, nor was the caller's taken), or
        ``replacing`` the call's, which ended before its stream's first chunk (the pipeline counts the call once:
        the measured span holds the other)."""
        if self._tracer is None or not call.started_ns or (call.span is not None and not replacing):
            return None
        try:
            if not replacing and any(is_llm_span(getattr(span, "attributes", None)) for span in call.started):
                return None  # named after its start (OpenLLMetry's Responses span): it has its own
            from opentelemetry.trace import SpanKind

            model = call.model if isinstance(call.model, str) else ""
            attributes = {"gen_ai.operation.name": "chat", STREAM_ATTR: call.stream}
            if model:
                attributes["gen_ai.request.model"] = model
            span = self._tracer.start_span(
                f"chat {model}".strip(),
                context=call.context,
                kind=SpanKind.CLIENT,
                attributes=attributes,
                start_time=call.started_ns,
            )
        except Exception:
            self._count("errors")
            return None
        call.span = call.filler = span
        self._count("filled")
        return span

    @staticmethod
    def _end_filler(call: _Call) -> None:
        filler, call.filler = call.filler, None
        if filler is not None:
            filler.end()

    def wrap(
        self, create: Callable[..., Any], stream: bool | None = None, result_key: str | None = None
    ) -> Callable[..., Any]:
        """``create`` (a client's sync or async method) wrapped: same arguments, same result, except that a
        streaming result comes back as a :class:`TimedStream` (or, with ``result_key``, holds one there: boto3's
        Bedrock calls return a dict). Whether a call streams: ``stream`` for a method that always or never does
        (``generate_content_stream``, ``converse``), else its ``stream=`` keyword."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            model = kwargs.get("model", kwargs.get("modelId"))
            call = _Call(kwargs.get("stream") is True if stream is None else stream, model, result_key)
            headers = kwargs.get("extra_headers")
            call.raw = isinstance(headers, Mapping) and headers.get(RAW_RESPONSE_HEADER) is not None
            call.caller = self._caller_span()
            if self._tracer is not None:
                self._note_start(call)
            self._count("calls")
            token = _CALL.set(call)
            try:
                result = create(*args, **kwargs)
            finally:
                _CALL.reset(token)
            if inspect.isawaitable(result):
                return self._awaited(call, result)
            return self._finished(call, result)

        timed.__wrapped__ = create  # type: ignore[attr-defined]
        return timed

    def wrap_manager(self, stream: Callable[..., Any]) -> Callable[..., Any]:
        """``stream`` (a method returning a stream helper's manager, ``client.messages.stream`` of the anthropic
        client) wrapped: the manager comes back as a :class:`TimedStreamManager`, and spans started while the call
        is made or while the manager is entered (the request sent) are matched to it; a streaming call."""

        def managed(*args: Any, **kwargs: Any) -> Any:
            call = _Call(True, kwargs.get("model"))
            call.caller = self._caller_span()
            if self._tracer is not None:
                self._note_start(call)
            self._count("calls")
            with self._during(call, adopt=False):
                manager = stream(*args, **kwargs)
            return TimedStreamManager(
                manager, lambda: self._during(call), lambda: self._first_chunk(call), lambda: self._end_filler(call)
            )

        managed.__wrapped__ = stream  # type: ignore[attr-defined]
        return managed

    @staticmethod
    def _note_start(call: _Call) -> None:
        from opentelemetry import context

        call.started_ns = time.time_ns()
        call.context = context.get_current()

    @contextmanager
    def _during(self, call: _Call, adopt: bool = True) -> Iterator[None]:
        """``call`` is the current call (spans started now are offered to it); then, with ``adopt``, the caller's
        LLM span is taken if none started."""
        token = _CALL.set(call)
        try:
            yield
        finally:
            _CALL.reset(token)
        if adopt:
            self._adopt_caller(call)

    async def _awaited(self, call: _Call, pending: Any) -> Any:
        # An async client starts its span when the coroutine runs: the call is current while it does.
        token = _CALL.set(call)
        try:
            result = await pending
        finally:
            _CALL.reset(token)
        return self._finished(call, result)

    def instrument(self, client: Any) -> Any:
        """Wrap the generating methods of an LLM client (:data:`CLIENT_METHODS`: OpenAI's chat completions,
        completions and Responses API, Anthropic's messages, Google Gen AI's ``generate_content`` and its
        stream, sync and ``aio``, boto3 Bedrock's ``converse`` and ``invoke_model`` forms, the ``litellm`` module's
        ``completion`` and ``acompletion``, Mistral's ``chat.stream`` / ``chat.complete`` and their async forms), on
        this object only, those it has; returns it. Idempotent. A module's
        functions are replaced on the module: code that imported them by name before keeps the originals."""
        for path, how in CLIENT_METHODS:
            resource: Any = client
            for name in path[:-1]:
                resource = getattr(resource, name, None)
            method = getattr(resource, path[-1], None)
            if not callable(method) or getattr(method, "_ttft_first_chunk", False):
                continue
            if how == "manager":
                timed = self.wrap_manager(method)
            elif isinstance(how, str):  # the stream is this key of the result
                timed = self.wrap(method, True, result_key=how)
            else:
                timed = self.wrap(method, how)
            timed._ttft_first_chunk = True  # type: ignore[attr-defined]
            setattr(resource, path[-1], timed)
            _forget_raw_wrappers(resource)
        return client


def _forget_raw_wrappers(resource: Any) -> None:
    """Drop a Stainless resource's cached ``with_streaming_response`` / ``with_raw_response``: each copies the
    resource's methods when first read, so one read before :meth:`FirstChunkTiming.instrument` would keep calling
    the unwrapped ``create``. Read again, they wrap the timed one (the OpenAI Agents SDK streams through
    ``client.responses.with_streaming_response.create``)."""
    cached = getattr(resource, "__dict__", None)
    if isinstance(cached, dict):
        for name in ("with_streaming_response", "with_raw_response"):
            cached.pop(name, None)


#: The methods :meth:`FirstChunkTiming.instrument` wraps, by attribute path from the client, and how: ``None``
#: streams when called with ``stream=True``; ``True`` / ``False`` always / never streams; ``"manager"`` returns a
#: stream helper's manager; another string: always streams, the stream being that key of the result (boto3).
#: ``client.responses.stream(...)`` (OpenAI) sends its request through ``client.responses.create``, so it is
#: timed too.
CLIENT_METHODS: Final[tuple[tuple[tuple[str, ...], bool | str | None], ...]] = (
    (("chat", "completions", "create"), None),  # OpenAI
    (("completions", "create"), None),  # OpenAI, Anthropic (legacy text completions)
    (("responses", "create"), None),  # OpenAI Responses API
    (("messages", "create"), None),  # Anthropic
    (("messages", "stream"), "manager"),  # Anthropic's stream helper
    (("models", "generate_content_stream"), True),  # Google Gen AI (google-genai)
    (("models", "generate_content"), False),
    (("aio", "models", "generate_content_stream"), True),
    (("aio", "models", "generate_content"), False),
    (("converse_stream",), "stream"),  # boto3 bedrock-runtime: {"stream": EventStream}
    (("invoke_model_with_response_stream",), "body"),
    (("converse",), False),
    (("invoke_model",), False),
    (("completion",), None),  # the litellm module: time_first_chunk(litellm)
    (("acompletion",), None),
    # Mistral (mistralai): its stream methods take no stream= keyword (EventStream of CompletionEvent)
    (("chat", "stream"), True),
    (("chat", "stream_async"), True),
    (("chat", "complete"), False),
    (("chat", "complete_async"), False),
)


#: The process's helper, used by :func:`time_first_chunk`.
_DEFAULT: FirstChunkTiming | None = None
_DEFAULT_LOCK = threading.Lock()
_PROVIDERS: list[Any] = []


def time_first_chunk(client: Any, tracer_provider: Any = None, fill_missing: bool = False) -> FirstChunkTiming:
    """Set the first chunk on the LLM spans of ``client``'s generating calls (:data:`CLIENT_METHODS`): adds the
    helper's span processor to ``tracer_provider`` (default: the global one; an SDK ``TracerProvider``; once per
    provider) and wraps the client's methods (:meth:`FirstChunkTiming.instrument`). ``fill_missing``: a call that
    starts no LLM span gets the helper's own (:meth:`FirstChunkTiming.fill_missing_spans`; openai-v2 2.4b0 does not
    trace the Responses API). Returns the process's helper (its ``stats``). Raises ``TypeError`` at set-up when
    the provider cannot take a span processor."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = FirstChunkTiming()
        timing = _DEFAULT
        if tracer_provider is None:
            from opentelemetry import trace

            tracer_provider = trace.get_tracer_provider()
        add = getattr(tracer_provider, "add_span_processor", None)
        if add is None:
            raise TypeError(
                f"time_first_chunk needs an SDK TracerProvider (add_span_processor); got {type(tracer_provider)!r}"
            )
        if not any(p is tracer_provider for p in _PROVIDERS):
            add(timing.span_processor())
            _PROVIDERS.append(tracer_provider)
        if fill_missing:
            timing.fill_missing_spans(tracer_provider)
    timing.instrument(client)
    return timing


__all__ = [
    "CLIENT_METHODS",
    "FIRST_CHUNK_ATTR",
    "LLM_OPERATIONS",
    "OWN_FIRST_CHUNK_ATTR",
    "STREAM_ATTR",
    "FirstChunkStats",
    "FirstChunkTiming",
    "TimedStream",
    "is_llm_span",
    "time_first_chunk",
]
