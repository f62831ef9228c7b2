from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.context import attach, detach
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context
from ttft_emit.otel import (
    FIRST_CHUNK_ATTR,
    OWN_FIRST_CHUNK_ATTR,
    STREAM_ATTR,
    FirstChunkTiming,
    TimedStream,
    time_first_chunk,
)

#: The emitter's source: ttft_emit.otel's tests live here, not in emitter/tests, because they need
#: OpenTelemetry's SDK, which the emitter's own Python 3.9 test run does not install.
SRC = Path(__file__).resolve().parents[2] / "emitter" / "src"
FIRST_CHUNK_S = 0.05
CHUNKS = ("Paris", " is", " nice")


def _provider() -> tuple[TracerProvider, InMemorySpanExporter, FirstChunkTiming]:
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    timing = FirstChunkTiming()
    provider.add_span_processor(timing.span_processor())
    return provider, exported, timing


class FakeCompletions:
    """What openai-v2 2.4b0 does: start the LLM span (attached as the current span) inside ``create``; a
    plain call ends it before returning, a stream when it is exhausted; nothing about the first chunk."""

    def __init__(self, provider: TracerProvider, operation: str = "chat") -> None:
        self.tracer = provider.get_tracer("opentelemetry.util.genai.handler")
        self.operation = operation

    def create(self, *, model: str, stream: bool = False) -> Any:
        attrs = {"gen_ai.operation.name": self.operation, "gen_ai.request.model": model}
        span = self.tracer.start_span(f"{self.operation} {model}", attributes=attrs)
        token = attach(set_span_in_context(span))
        if not stream:
            time.sleep(0.01)
            span.end()
            detach(token)
            return {"choices": ["".join(CHUNKS)]}
        return self._stream(span, token)

    def _stream(self, span: Any, token: object) -> Iterator[str]:
        time.sleep(FIRST_CHUNK_S)
        try:
            yield from CHUNKS
        finally:
            span.end()
            detach(token)


class FakeAsyncCompletions(FakeCompletions):
    async def create(self, *, model: str, stream: bool = False) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        span = self.tracer.start_span(f"chat {model}", attributes={"gen_ai.operation.name": "chat"})
        if not stream:
            span.end()
            return {"choices": ["".join(CHUNKS)]}
        return self._astream(span)

    async def _astream(self, span: Any) -> AsyncIterator[str]:
        await asyncio.sleep(FIRST_CHUNK_S)
        for chunk in CHUNKS:
            yield chunk
        span.end()


class FakeClient:
    def __init__(self, completions: FakeCompletions) -> None:
        self.chat = type("Chat", (), {})()
        self.chat.completions = completions


def _llm(exported: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [s for s in exported.get_finished_spans() if (s.attributes or {}).get("gen_ai.operation.name") == "chat"]
    return span


def test_a_streaming_call_gets_its_first_chunk_and_stream_flag_on_its_llm_span() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(FakeCompletions(provider).create)
    with provider.get_tracer("app").start_as_current_span("POST /ask"):
        called = time.time_ns()
        stream = create(model="m", stream=True)
        assert isinstance(stream, TimedStream)
        chunks, seen_ns = [], []
        for chunk in stream:
            chunks.append(chunk)
            seen_ns.append(time.time_ns())
    assert chunks == list(CHUNKS)
    span = _llm(exported)
    attrs = span.attributes or {}
    assert attrs[STREAM_ATTR] is True
    first_ns = span.start_time + round(float(attrs[FIRST_CHUNK_ATTR]) * 1e9)  # type: ignore[operator, arg-type]
    assert span.start_time >= called and first_ns <= seen_ns[0]
    assert attrs[FIRST_CHUNK_ATTR] >= FIRST_CHUNK_S  # type: ignore[operator]
    assert attrs[OWN_FIRST_CHUNK_ATTR] == attrs[FIRST_CHUNK_ATTR]  # the one no instrumentation overwrites
    assert first_ns <= span.end_time  # type: ignore[operator]
    (root,) = [s for s in exported.get_finished_spans() if s.name == "POST /ask"]
    assert FIRST_CHUNK_ATTR not in (root.attributes or {}) and STREAM_ATTR not in (root.attributes or {})
    assert timing.stats.calls == 1 and timing.stats.spans == 1 and timing.stats.first_chunks == 1
    assert timing.stats.unmatched == 0 and timing.stats.errors == 0


def test_a_plain_call_is_marked_not_streaming_and_returned_unchanged() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(FakeCompletions(provider).create)
    assert create(model="m") == {"choices": ["Paris is nice"]}
    attrs = _llm(exported).attributes or {}
    assert attrs[STREAM_ATTR] is False and FIRST_CHUNK_ATTR not in attrs
    assert timing.stats.spans == 1 and timing.stats.first_chunks == 0


def test_a_call_that_starts_no_llm_span_is_counted_and_leaves_every_span_alone() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(FakeCompletions(provider, operation="embeddings").create)
    assert list(create(model="e", stream=True)) == list(CHUNKS)
    assert create(model="e") == {"choices": ["Paris is nice"]}
    spans = exported.get_finished_spans()
    assert len(spans) == 2
    for span in spans:
        assert STREAM_ATTR not in (span.attributes or {}) and FIRST_CHUNK_ATTR not in (span.attributes or {})
    assert timing.stats.unmatched == 2 and timing.stats.spans == 0
    # Outside a wrapped call the processor matches nothing, even an LLM span.
    FakeCompletions(provider).create(model="m")
    assert STREAM_ATTR not in (_llm(exported).attributes or {})


class SuppressedCompletions:
    """A client whose own instrumentation is suppressed under a framework's LLM span (OpenLLMetry's LangChain
    instrumentation does so): ``create`` starts no span."""

    def create(self, *, model: str, stream: bool = False) -> Any:
        if not stream:
            time.sleep(0.01)
            return {"choices": ["".join(CHUNKS)]}
        return self._stream()

    def _stream(self) -> Iterator[str]:
        time.sleep(FIRST_CHUNK_S)
        yield from CHUNKS


def test_a_call_made_inside_a_framework_llm_span_times_that_span() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(SuppressedCompletions().create)
    tracer = provider.get_tracer("opentelemetry.instrumentation.langchain")
    with tracer.start_as_current_span("ChatOpenAI.chat", attributes={"gen_ai.operation.name": "chat"}) as llm:
        started = llm.start_time  # type: ignore[attr-defined]
        seen_ns = []
        for _ in create(model="m", stream=True):
            seen_ns.append(time.time_ns())
    attrs = _llm(exported).attributes or {}
    assert attrs[STREAM_ATTR] is True
    assert FIRST_CHUNK_S <= attrs[FIRST_CHUNK_ATTR] <= (seen_ns[0] - started) / 1e9  # type: ignore[operator]
    assert timing.stats.spans == 1 and timing.stats.first_chunks == 1 and timing.stats.unmatched == 0
    # a plain call inside one: not streaming; a call under a span that is no LLM span: unmatched, untouched
    with tracer.start_as_current_span("ChatOpenAI.chat", attributes={"gen_ai.operation.name": "chat"}):
        create(model="m")
    with tracer.start_as_current_span("RunnableSequence.workflow"):
        list(create(model="m", stream=True))
    plain, workflow = exported.get_finished_spans()[-2:]
    assert (plain.attributes or {})[STREAM_ATTR] is False and FIRST_CHUNK_ATTR not in (plain.attributes or {})
    assert STREAM_ATTR not in (workflow.attributes or {}) and timing.stats.unmatched == 1


class HeldKindSpan:
    """OpenInference's span proxy (``OpenInferenceSpan``, openinference-instrumentation 0.1.72): it keeps
    ``openinference.span.kind`` in ``_self_important_attributes`` and writes it onto the span only when it ends."""

    def __init__(self, span: Any) -> None:
        self._span = span
        self._self_important_attributes: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._span, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # as wrapt's ObjectProxy: an instance of the span's class (OpenTelemetry checks)
        return type(self._span)

    def set_attribute(self, key: str, value: Any) -> None:
        if key == "openinference.span.kind":
            self._self_important_attributes[key] = value
        else:
            self._span.set_attribute(key, value)

    def end(self) -> None:
        for key, value in self._self_important_attributes.items():
            self._span.set_attribute(key, value)
        self._span.end()


def test_a_call_inside_an_openinference_llm_span_whose_kind_is_held_times_that_span() -> None:
    """OpenInference's Haystack instrumentor (0.1.46) sets ``OpenAIChatGenerator.run``'s kind after its start: until
    it ends, the span said nothing, and the helper found no LLM span (captured: haystack_openinference_haystack_only_
    helper, every request ``no_first_chunk`` before)."""
    provider, exported, timing = _provider()
    create = timing.wrap(SuppressedCompletions().create)
    tracer = provider.get_tracer("openinference.instrumentation.haystack")
    generator = HeldKindSpan(tracer.start_span("OpenAIChatGenerator.run"))
    generator.set_attribute("openinference.span.kind", "LLM")
    token = attach(set_span_in_context(generator))  # type: ignore[arg-type]
    try:
        chunks = list(create(model="m", stream=True))
    finally:
        detach(token)
    generator.end()
    assert chunks == list(CHUNKS)
    (span,) = exported.get_finished_spans()
    attrs = span.attributes or {}
    assert attrs["openinference.span.kind"] == "LLM" and attrs[STREAM_ATTR] is True
    assert attrs[FIRST_CHUNK_ATTR] >= FIRST_CHUNK_S  # type: ignore[operator]
    assert timing.stats.spans == 1 and timing.stats.first_chunks == 1 and timing.stats.unmatched == 0


def test_a_call_under_openinferences_langchain_span_named_at_its_end_times_that_span() -> None:
    """OpenInference's LangChain tracer (0.1.80) starts a run's span with its name alone, not made current, and sets
    every attribute at its end: the newest such span still recording is the chat model's (captured:
    azure_langchain_openinference_helper, every stream ``no_first_chunk`` before). A chain's span, named and
    recording, is older; a tool's span that ended is skipped."""
    provider, exported, timing = _provider()
    create = timing.wrap(SuppressedCompletions().create)
    tracer = provider.get_tracer("openinference.instrumentation.langchain")
    chain = tracer.start_span("RunnableSequence")
    tracer.start_span("ChatPromptTemplate").end()
    model = tracer.start_span("AzureChatOpenAI")  # the run's span: no attributes until it ends
    chunks = list(create(model="m", stream=True))
    model.set_attribute("openinference.span.kind", "LLM")
    model.end()
    chain.set_attribute("openinference.span.kind", "CHAIN")
    chain.end()
    assert chunks == list(CHUNKS)
    spans = {s.name: s.attributes or {} for s in exported.get_finished_spans()}
    assert spans["AzureChatOpenAI"][STREAM_ATTR] is True
    assert spans["AzureChatOpenAI"][FIRST_CHUNK_ATTR] >= FIRST_CHUNK_S  # type: ignore[operator]
    assert STREAM_ATTR not in spans["RunnableSequence"] and STREAM_ATTR not in spans["ChatPromptTemplate"]
    assert timing.stats.spans == 1 and timing.stats.first_chunks == 1 and timing.stats.unmatched == 0
    # the same span of another scope, or already named something else: no match
    other = provider.get_tracer("some.framework").start_span("AzureChatOpenAI")
    list(create(model="m", stream=True))
    other.end()
    assert timing.stats.unmatched == 1


class LateNamingCompletions:
    """OpenLIT's way: ``create`` starts its LLM span with no attributes and names it (``gen_ai.operation.name``)
    when the stream ends; an HTTP client's span under it ends when the response headers arrive."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("openlit.instrumentation.openai")

    def create(self, *, model: str, stream: bool = False) -> Any:
        span = self.tracer.start_span(f"chat {model}")
        http = self.tracer.start_span("POST")
        http.end()  # the headers came
        return self._stream(span)

    def _stream(self, span: Any) -> Iterator[str]:
        time.sleep(FIRST_CHUNK_S)
        yield from CHUNKS
        span.set_attribute("gen_ai.operation.name", "chat")
        span.end()


def test_a_streaming_call_whose_llm_span_is_named_at_its_end_is_timed_on_it() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(LateNamingCompletions(provider).create)
    called = time.time_ns()
    seen_ns = []
    for _ in create(model="m", stream=True):
        seen_ns.append(time.time_ns())
    attrs = _llm(exported).attributes or {}
    assert attrs[STREAM_ATTR] is True
    assert FIRST_CHUNK_S <= attrs[FIRST_CHUNK_ATTR] <= (seen_ns[0] - called) / 1e9  # type: ignore[operator]
    (http,) = [s for s in exported.get_finished_spans() if s.name == "POST"]
    assert FIRST_CHUNK_ATTR not in (http.attributes or {})  # it had ended: never the HTTP span
    assert timing.stats.spans == 1 and timing.stats.first_chunks == 1 and timing.stats.unmatched == 0


def test_an_error_from_the_call_reaches_the_caller_and_the_call_is_over() -> None:
    provider, exported, timing = _provider()

    def failing(**kwargs: Any) -> Any:
        raise TimeoutError("model timed out")

    with pytest.raises(TimeoutError):
        timing.wrap(failing)(model="m", stream=True)
    FakeCompletions(provider).create(model="m")  # started after the failed call: not its span
    assert STREAM_ATTR not in (_llm(exported).attributes or {})


def test_an_async_client_is_timed_the_same_way() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(FakeAsyncCompletions(provider).create)

    async def ask() -> list[str]:
        stream = await create(model="m", stream=True)
        return [chunk async for chunk in stream]

    assert asyncio.run(ask()) == list(CHUNKS)
    attrs = _llm(exported).attributes or {}
    assert attrs[STREAM_ATTR] is True and attrs[FIRST_CHUNK_ATTR] >= FIRST_CHUNK_S  # type: ignore[operator]
    assert asyncio.run(create(model="m")) == {"choices": ["Paris is nice"]}
    assert timing.stats.spans == 2 and timing.stats.first_chunks == 1


def test_concurrent_calls_on_threads_each_time_their_own_span() -> None:
    provider, exported, timing = _provider()
    create = timing.wrap(FakeCompletions(provider).create)

    def ask(i: int) -> None:
        for _ in create(model=f"m{i}", stream=i % 2 == 0):
            pass

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spans = [s for s in exported.get_finished_spans() if s.name.startswith("chat ")]
    assert len(spans) == 8
    for span in spans:
        streamed = int(span.name.split(" m")[1]) % 2 == 0
        attrs = span.attributes or {}
        assert attrs[STREAM_ATTR] is streamed and (FIRST_CHUNK_ATTR in attrs) is streamed
    assert timing.stats.spans == 8 and timing.stats.first_chunks == 4


def test_time_first_chunk_wraps_the_client_once_and_adds_its_processor_once() -> None:
    provider = TracerProvider()
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    client = FakeClient(FakeCompletions(provider))
    timing = time_first_chunk(client, tracer_provider=provider)
    assert time_first_chunk(client, tracer_provider=provider) is timing
    calls_before = timing.stats.calls
    with client.chat.completions.create(model="m", stream=True) as stream:
        assert next(iter(stream)) == "Paris"
    assert timing.stats.calls == calls_before + 1  # wrapped once, not twice
    assert FakeCompletions(provider).create is not client.chat.completions.create
    with pytest.raises(TypeError):
        time_first_chunk(client, tracer_provider=object())


class FakeMistralChat:
    """mistralai's chat: ``stream`` always streams and takes no ``stream=`` keyword, ``complete`` never does; its
    own tracing (3.7, opt-in) names the span an LLM call."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("mistralai_sdk_tracer")

    def stream(self, *, model: str) -> Iterator[str]:
        span = self.tracer.start_span(f"chat {model}", attributes={"gen_ai.operation.name": "chat"})
        return self._events(span)  # the request is sent in the call; the events come later

    def _events(self, span: Any) -> Iterator[str]:
        time.sleep(FIRST_CHUNK_S)
        try:
            yield from CHUNKS
        finally:
            span.end()

    def complete(self, *, model: str) -> str:
        with self.tracer.start_as_current_span(f"chat {model}", attributes={"gen_ai.operation.name": "chat"}):
            return "".join(CHUNKS)


def test_mistrals_chat_stream_and_complete_are_timed_by_the_method_not_a_keyword() -> None:
    """Captured (capture_more_providers.py): ``time_first_chunk`` wrapped nothing of mistralai's chat API before."""
    provider, exported, timing = _provider()
    client = type("Mistral", (), {})()
    client.chat = FakeMistralChat(provider)
    timing.instrument(client)
    assert list(client.chat.stream(model="m")) == list(CHUNKS)
    assert client.chat.complete(model="m") == "Paris is nice"
    streamed, plain = [s.attributes or {} for s in exported.get_finished_spans()]
    assert streamed[STREAM_ATTR] is True and streamed[FIRST_CHUNK_ATTR] >= FIRST_CHUNK_S  # type: ignore[operator]
    assert plain[STREAM_ATTR] is False and FIRST_CHUNK_ATTR not in plain


def test_the_stream_wrapper_proxies_the_stream() -> None:
    class Stream:
        response = "raw"
        closed = False

        def __iter__(self) -> Iterator[int]:
            return iter([1, 2])

        def close(self) -> None:
            self.closed = True

    inner, seen = Stream(), []
    stream = TimedStream(inner, lambda: seen.append(1))
    assert stream.response == "raw" and list(stream) == [1, 2] and seen == [1]
    stream.close()
    assert inner.closed
    # An instance of the stream's class, as wrapt's proxies are: Semantic Kernel 1.45 checks isinstance(stream,
    # openai.AsyncStream) on its streaming path and failed every streamed call under the helper.
    assert isinstance(stream, Stream) and isinstance(stream, TimedStream) and type(stream) is TimedStream


def test_importing_the_helper_imports_neither_opentelemetry_nor_the_kafka_client() -> None:
    code = (
        "import sys, ttft_emit.otel; "
        "loaded = [m for m in ('opentelemetry', 'aiokafka', 'orjson') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(SRC)}, timeout=60)
