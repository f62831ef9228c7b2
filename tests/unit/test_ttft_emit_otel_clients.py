"""ttft-emit's helper on the clients beyond OpenAI's chat completions: the OpenAI Responses API and Anthropic's
messages (typed events, the first of which carries no token), Anthropic's stream helper (a manager whose stream
reads a raw event stream), and Google Gen AI's ``generate_content`` / ``generate_content_stream`` (no ``stream``
keyword). Fakes shaped as those SDKs are; the real SDKs under their instrumentations are captured in
tests/data/otel_instrumentations (``*_helper``) and read by tests/unit/test_otlp_providers.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ttft_emit.otel import FIRST_CHUNK_ATTR, STREAM_ATTR
from ttft_emit.otel_streams import is_output

from tests.unit.test_ttft_emit_otel import _provider

#: Before the first token: the typed events a stream starts with (sent when the request is accepted).
PREAMBLE_S = 0.005
FIRST_TOKEN_S = 0.06


@dataclass
class Event:
    type: str
    text: str = ""


ANTHROPIC = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta"]
RESPONSES = ["response.created", "response.in_progress", "response.output_text.delta", "response.completed"]


def _events(types: list[str]) -> Iterator[Event]:
    """The preamble at once, the first token after FIRST_TOKEN_S."""
    time.sleep(PREAMBLE_S)
    waited = False
    for kind in types:
        if not waited and is_output(Event(kind)):
            time.sleep(FIRST_TOKEN_S)
            waited = True
        yield Event(kind, "x")


class RawStream:
    """A raw event stream (the SDKs' ``Stream``): iterable once, closable."""

    def __init__(self, types: list[str], span: Any) -> None:
        self._events = _events(types)
        self._span = span

    def __iter__(self) -> Iterator[Event]:
        try:
            yield from self._events
        finally:
            self._span.end()

    def close(self) -> None:
        self._span.end()


class MessageStream:
    """Anthropic's stream helper's stream: every way of reading it goes through ``_raw_stream``, read lazily."""

    def __init__(self, raw: RawStream) -> None:
        self._raw_stream = raw

    def __iter__(self) -> Iterator[Event]:
        yield from self._raw_stream

    @property
    def text_stream(self) -> Iterator[str]:
        return (e.text for e in self if e.type == "content_block_delta")

    def get_final_text(self) -> str:
        return "".join(self.text_stream)


class MessageStreamManager:
    def __init__(self, request: Any) -> None:
        self._request = request
        self.stream: MessageStream | None = None

    def __enter__(self) -> MessageStream:
        self.stream = MessageStream(self._request())
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None:
            self.stream._raw_stream.close()


class Messages:
    """Like an instrumentation of ``anthropic`` (OpenLLMetry's ``anthropic.chat``): the LLM span starts in the call
    (for the stream helper, when the manager is entered: the request is sent then), ends with the stream."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("opentelemetry.instrumentation.anthropic")

    def _span(self) -> Any:
        return self.tracer.start_span("anthropic.chat", attributes={"gen_ai.operation.name": "chat"})

    def create(self, *, model: str, stream: bool = False) -> Any:
        span = self._span()
        if not stream:
            span.end()
            return {"content": "x"}
        return RawStream(ANTHROPIC, span)

    def stream(self, *, model: str) -> MessageStreamManager:
        return MessageStreamManager(lambda: RawStream(ANTHROPIC, self._span()))


class Responses:
    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("openinference.instrumentation.openai")

    def create(self, *, model: str, stream: bool = False) -> Any:
        span = self.tracer.start_span("Response", attributes={"openinference.span.kind": "LLM"})
        return RawStream(RESPONSES, span)


class Models:
    """Google Gen AI's ``client.models``: the stream is a separate method, lazy (the request goes out on the
    first iteration), the span starts at the call (OpenTelemetry's and OpenInference's instrumentations)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("openinference.instrumentation.google_genai")

    def _span(self, name: str) -> Any:
        return self.tracer.start_span(name, attributes={"openinference.span.kind": "LLM"})

    def generate_content(self, *, model: str) -> dict[str, str]:
        self._span("GenerateContent").end()
        return {"text": "x"}

    def generate_content_stream(self, *, model: str) -> Iterator[dict[str, str]]:
        span = self._span("GenerateContentStream")

        def chunks() -> Iterator[dict[str, str]]:
            time.sleep(FIRST_TOKEN_S)
            yield {"text": "x"}
            yield {"text": "y"}
            span.end()

        return chunks()


class AsyncModels(Models):
    async def generate_content_stream(self, *, model: str) -> AsyncIterator[dict[str, str]]:  # type: ignore[override]
        span = self._span("AsyncGenerateContentStream")

        async def chunks() -> AsyncIterator[dict[str, str]]:
            await asyncio.sleep(FIRST_TOKEN_S)
            yield {"text": "x"}
            span.end()

        return chunks()


class Client:
    def __init__(self, provider: TracerProvider) -> None:
        self.messages = Messages(provider)
        self.responses = Responses(provider)
        self.models = Models(provider)
        self.aio = type("Aio", (), {})()
        self.aio.models = AsyncModels(provider)


def _spans(exported: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exported.get_finished_spans() if s.name == name]


def _first_chunk_s(span: ReadableSpan) -> float:
    return float((span.attributes or {})[FIRST_CHUNK_ATTR])  # type: ignore[arg-type]


def test_only_deltas_of_typed_events_count_as_output() -> None:
    assert [is_output(Event(t)) for t in ANTHROPIC] == [False, False, False, True, True]
    assert [is_output(Event(t)) for t in RESPONSES] == [False, False, True, False]
    assert is_output(Event("response.function_call_arguments.delta"))
    assert is_output({"choices": []}) and is_output("text") and is_output(Event.__new__(Event))  # untyped chunks


def test_a_chat_chunk_with_the_role_alone_or_no_choices_is_no_output() -> None:
    """OpenAI's first chat chunk carries the role and empty content; Azure OpenAI's first has no choices
    (``prompt_filter_results``): a provider may send either before the first token."""
    from types import SimpleNamespace as NS

    def chunk(**delta: Any) -> Any:
        return NS(choices=[NS(delta=NS(**delta), index=0)])

    assert not is_output(chunk(role="assistant", content=""))
    assert not is_output(NS(choices=[], prompt_filter_results=[{}]))
    assert is_output(chunk(content="Par")) and is_output(chunk(tool_calls=[NS(index=0)]))
    assert is_output(chunk(refusal="no")) and is_output(NS(choices=[NS(text="Par")]))  # legacy completions
    assert not is_output(NS(data=chunk(role="assistant")))  # Mistral's CompletionEvent
    assert is_output(NS(data=chunk(content="Par")))


def test_the_first_chunk_of_a_typed_stream_is_its_first_delta_not_its_first_event() -> None:
    provider, exported, timing = _provider()
    client = timing.instrument(Client(provider))
    for stream in (client.messages.create(model="m", stream=True), client.responses.create(model="m", stream=True)):
        assert len(list(stream)) in (len(ANTHROPIC), len(RESPONSES))
    for name in ("anthropic.chat", "Response"):
        (span,) = _spans(exported, name)
        assert (span.attributes or {})[STREAM_ATTR] is True
        assert _first_chunk_s(span) >= FIRST_TOKEN_S, name  # not the preamble's PREAMBLE_S
    assert timing.stats.first_chunks == 2 and timing.stats.unmatched == 0


def test_anthropics_stream_helper_is_timed_whichever_way_its_stream_is_read() -> None:
    provider, exported, timing = _provider()
    client = timing.instrument(Client(provider))
    with client.messages.stream(model="m") as stream:
        assert [*stream.text_stream] == ["x", "x"]
    with client.messages.stream(model="m") as stream:
        assert stream.get_final_text() == "xx"
    spans = _spans(exported, "anthropic.chat")
    assert len(spans) == 2
    for span in spans:
        assert (span.attributes or {})[STREAM_ATTR] is True and _first_chunk_s(span) >= FIRST_TOKEN_S
    assert timing.stats.calls == 2 and timing.stats.first_chunks == 2 and timing.stats.errors == 0


def test_google_genai_streams_by_method_not_by_keyword() -> None:
    provider, exported, timing = _provider()
    client = timing.instrument(Client(provider))
    assert client.models.generate_content(model="g") == {"text": "x"}
    assert [c["text"] for c in client.models.generate_content_stream(model="g")] == ["x", "y"]

    async def read() -> list[dict[str, str]]:
        return [c async for c in await client.aio.models.generate_content_stream(model="g")]

    assert asyncio.run(read()) == [{"text": "x"}]
    (plain,) = _spans(exported, "GenerateContent")
    assert (plain.attributes or {})[STREAM_ATTR] is False and FIRST_CHUNK_ATTR not in (plain.attributes or {})
    for name in ("GenerateContentStream", "AsyncGenerateContentStream"):
        (span,) = _spans(exported, name)
        assert (span.attributes or {})[STREAM_ATTR] is True and _first_chunk_s(span) >= FIRST_TOKEN_S
    assert timing.stats.calls == 3 and timing.stats.spans == 3 and timing.stats.first_chunks == 2


def test_instrument_wraps_once_and_only_what_the_client_has() -> None:
    provider, _, timing = _provider()
    client = Client(provider)
    timing.instrument(client)
    wrapped = client.messages.stream
    timing.instrument(client)
    assert client.messages.stream is wrapped
    bare = type("Bare", (), {})()
    assert timing.instrument(bare) is bare and vars(bare) == {}


class Uninstrumented:
    """A method no instrumentation covers (openai-v2 2.4b0 and ``responses.create``): an HTTP client's span at most
    (``http_span``), or the span of an instrumentation that names it an LLM call only at its end (``late_llm``)."""

    def __init__(self, provider: TracerProvider, inside: str = "") -> None:
        self.tracer = provider.get_tracer("inside")
        self.inside = inside

    def create(self, *, model: str, stream: bool = False) -> Any:
        if self.inside:
            span = self.tracer.start_span("POST" if self.inside == "http_span" else "openai.response")
            if self.inside == "late_llm":
                span.set_attribute("gen_ai.operation.name", "chat")
            span.end()
        if not stream:
            return {"output_text": "x"}
        return iter([Event("response.created"), *_events(["response.output_text.delta", "response.completed"])])


def _fill_client(provider: TracerProvider, inside: str = "") -> Any:
    client = type("Client", (), {})()
    client.responses = Uninstrumented(provider, inside)
    return client


def test_fill_missing_gives_a_call_without_an_llm_span_the_helpers_own() -> None:
    provider, exported, timing = _provider()
    timing.fill_missing_spans(provider)
    client = timing.instrument(_fill_client(provider, inside="http_span"))
    with provider.get_tracer("app").start_as_current_span("POST /ask") as root:
        called = time.time_ns()
        assert len(list(client.responses.create(model="gpt-x", stream=True))) == 3
        assert client.responses.create(model="gpt-x") == {"output_text": "x"}
    streamed, plain = _spans(exported, "chat gpt-x")
    for span, streams in ((streamed, True), (plain, False)):
        attrs = span.attributes or {}
        assert attrs["gen_ai.operation.name"] == "chat" and attrs[STREAM_ATTR] is streams
        assert span.parent is not None and span.parent.span_id == root.get_span_context().span_id
        assert called <= span.start_time <= span.end_time  # type: ignore[operator]
    assert _first_chunk_s(streamed) >= FIRST_TOKEN_S and FIRST_CHUNK_ATTR not in (plain.attributes or {})
    assert timing.stats.filled == 2 and timing.stats.first_chunks == 1 and timing.stats.unmatched == 0


def test_no_span_is_filled_when_off_or_when_the_instrumentation_named_its_own_late() -> None:
    for fill, inside in ((False, ""), (True, "late_llm")):
        provider, exported, timing = _provider()
        if fill:
            timing.fill_missing_spans(provider)
        client = timing.instrument(_fill_client(provider, inside))
        assert client.responses.create(model="gpt-x") == {"output_text": "x"}
        assert not _spans(exported, "chat gpt-x") and timing.stats.filled == 0
        assert timing.stats.unmatched == 1


class BedrockRuntime:
    """boto3's ``bedrock-runtime`` client as an instrumentation sees it (OpenTelemetry's botocore: ``chat <model>``
    named at its start): the stream is a key of the result, an iterable of one-key dicts."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("opentelemetry.instrumentation.botocore.bedrock-runtime")

    def _span(self, model_id: str) -> Any:
        return self.tracer.start_span(f"chat {model_id}", attributes={"gen_ai.operation.name": "chat"})

    def _events(self, model_id: str, events: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        span = self._span(model_id)  # in the call; the stream ends it

        def read() -> Iterator[dict[str, Any]]:
            time.sleep(PREAMBLE_S)
            yield events[0]
            time.sleep(FIRST_TOKEN_S)
            yield from events[1:]
            span.end()

        return read()

    def converse_stream(self, *, modelId: str, messages: list[Any]) -> dict[str, Any]:
        events = [{"messageStart": {"role": "assistant"}}, {"contentBlockDelta": {"delta": {"text": "x"}}}]
        return {"ResponseMetadata": {}, "stream": self._events(modelId, events)}

    def invoke_model_with_response_stream(self, *, modelId: str, body: str) -> dict[str, Any]:
        def chunk(doc: dict[str, Any]) -> dict[str, Any]:
            return {"chunk": {"bytes": json.dumps(doc).encode()}}

        events = [chunk({"type": "message_start"}), chunk({"type": "content_block_delta", "delta": {"text": "x"}})]
        return {"contentType": "application/json", "body": self._events(modelId, events)}

    def converse(self, *, modelId: str, messages: list[Any]) -> dict[str, Any]:
        self._span(modelId).end()
        return {"output": {"message": {"content": [{"text": "x"}]}}}


def test_bedrock_streams_are_timed_at_their_first_delta_inside_the_result() -> None:
    provider, exported, timing = _provider()
    client = timing.instrument(BedrockRuntime(provider))
    assert len(list(client.converse_stream(modelId="claude", messages=[])["stream"])) == 2
    assert len(list(client.invoke_model_with_response_stream(modelId="claude", body="{}")["body"])) == 2
    assert client.converse(modelId="claude", messages=[])["output"]
    streamed_a, streamed_b, plain = _spans(exported, "chat claude")
    for span in (streamed_a, streamed_b):
        assert (span.attributes or {})[STREAM_ATTR] is True
        assert _first_chunk_s(span) >= FIRST_TOKEN_S  # not messageStart / message_start (PREAMBLE_S)
    assert (plain.attributes or {})[STREAM_ATTR] is False
    assert timing.stats.calls == 3 and timing.stats.first_chunks == 2 and timing.stats.unmatched == 0


def test_a_module_of_functions_is_wrapped_in_place() -> None:
    """``time_first_chunk(litellm)``: the module's ``completion`` and ``acompletion`` take ``stream=True``."""
    provider, exported, timing = _provider()
    module = type("litellm", (), {})()
    messages = Messages(provider)
    module.completion = lambda **kwargs: messages.create(**kwargs)

    async def acompletion(**kwargs: Any) -> Any:
        return messages.create(**kwargs)

    module.acompletion = acompletion
    timing.instrument(module)
    assert len(list(module.completion(model="m", stream=True))) == len(ANTHROPIC)
    assert asyncio.run(module.acompletion(model="m")) == {"content": "x"}
    streamed, plain = _spans(exported, "anthropic.chat")
    assert _first_chunk_s(streamed) >= FIRST_TOKEN_S and (plain.attributes or {})[STREAM_ATTR] is False


class HeadersOnly:
    """Logfire's span of a stream (5.4): started in the call, ended when the call returns (the response headers)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("logfire.openai")

    def create(self, *, model: str, stream: bool = False) -> Any:
        self.tracer.start_span("Chat Completion", attributes={"gen_ai.operation.name": "chat"}).end()
        return _events(RESPONSES) if stream else {"output_text": "x"}


def test_fill_missing_replaces_a_span_that_ended_before_its_streams_first_chunk() -> None:
    provider, exported, timing = _provider()
    timing.fill_missing_spans(provider)
    client = type("Client", (), {})()
    client.responses = HeadersOnly(provider)
    timing.instrument(client)
    called = time.time_ns()
    assert len(list(client.responses.create(model="gpt-x", stream=True))) == len(RESPONSES)
    (theirs,) = _spans(exported, "Chat Completion")
    (ours,) = _spans(exported, "chat gpt-x")
    assert called <= ours.start_time <= theirs.start_time  # type: ignore[operator]
    assert theirs.end_time <= ours.end_time  # type: ignore[operator]  # holds it: the pipeline counts ours
    assert _first_chunk_s(ours) >= FIRST_TOKEN_S and (ours.attributes or {})[STREAM_ATTR] is True
    assert timing.stats.filled == 1 and timing.stats.first_chunks == 1 and timing.stats.errors == 0


class NamedAtHeaders:
    """OpenInference's Groq instrumentor (0.1.33): its span starts unnamed, and names itself an LLM call when it ends,
    with the response headers, before the stream's first chunk."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("openinference.instrumentation.groq")

    def create(self, *, model: str, stream: bool = False) -> Any:
        span = self.tracer.start_span("Completions")
        span.set_attribute("openinference.span.kind", "LLM")
        span.end()
        return _events(RESPONSES) if stream else {"output_text": "x"}


def test_fill_missing_times_a_stream_whose_span_named_itself_at_the_headers() -> None:
    """It found no span to time before (unmatched): the span was no LLM span while it recorded."""
    provider, exported, timing = _provider()
    timing.fill_missing_spans(provider)
    client = type("Client", (), {})()
    client.responses = NamedAtHeaders(provider)
    timing.instrument(client)
    assert len(list(client.responses.create(model="gpt-x", stream=True))) == len(RESPONSES)
    (theirs,) = _spans(exported, "Completions")
    (ours,) = _spans(exported, "chat gpt-x")
    assert ours.start_time <= theirs.start_time and theirs.end_time <= ours.end_time  # type: ignore[operator]
    assert _first_chunk_s(ours) >= FIRST_TOKEN_S and (ours.attributes or {})[STREAM_ATTR] is True
    assert timing.stats.filled == 1 and timing.stats.first_chunks == 1 and timing.stats.unmatched == 0


class HeadersOnlyMessages(Messages):
    """Logfire's span of Anthropic's stream helper: ended when the request's headers came (entering the manager)."""

    def stream(self, *, model: str) -> MessageStreamManager:
        def request() -> RawStream:
            span = self._span()
            span.end()
            return RawStream(ANTHROPIC, span)

        return MessageStreamManager(request)


def test_fill_missing_on_a_stream_helper_starts_at_the_call_and_ends_with_the_manager() -> None:
    provider, exported, timing = _provider()
    timing.fill_missing_spans(provider)
    client = type("Client", (), {})()
    client.messages = HeadersOnlyMessages(provider)
    timing.instrument(client)
    with provider.get_tracer("app").start_as_current_span("POST /ask") as root:
        called = time.time_ns()
        with client.messages.stream(model="claude") as stream:
            assert stream.get_final_text() == "xx"
    (ours,) = _spans(exported, "chat claude")
    assert ours.parent is not None and ours.parent.span_id == root.get_span_context().span_id
    assert called <= ours.start_time < called + 5_000_000  # type: ignore[operator]  # the call, not the first chunk
    assert _first_chunk_s(ours) >= FIRST_TOKEN_S and timing.stats.filled == 1


class RawResponse:
    """A Stainless client's raw response of a streaming call (``AsyncAPIResponse``): ``parse()`` (awaited) gives the
    event stream; ``close()`` closes it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed = False
        self.request_id = "req_1"

    async def parse(self) -> Any:
        return self._stream

    async def close(self) -> None:
        self.closed = True


class AsyncEvents:
    """The event stream of an async client: the preamble at once, the first delta after FIRST_TOKEN_S."""

    def __init__(self, types: list[str]) -> None:
        self._types = types

    async def __aiter__(self) -> AsyncIterator[Event]:
        await asyncio.sleep(PREAMBLE_S)
        waited = False
        for kind in self._types:
            if not waited and is_output(Event(kind)):
                await asyncio.sleep(FIRST_TOKEN_S)
                waited = True
            yield Event(kind, "x")


class StainlessResponses:
    """``client.responses`` of the async openai client, instrumented like OpenInference's OpenAI instrumentor does
    with ``with_streaming_response``: its span starts in the call and ends when the call returns (the headers).
    ``with_streaming_response`` is built when first read, around the ``create`` the resource has then."""

    def __init__(self, provider: TracerProvider) -> None:
        self.tracer = provider.get_tracer("openinference.instrumentation.openai")

    async def create(self, *, model: str, stream: bool = False, extra_headers: Any = None) -> Any:
        self.tracer.start_span("Response", attributes={"openinference.span.kind": "LLM"}).end()
        raw = (extra_headers or {}).get("X-Stainless-Raw-Response") == "stream"
        events = AsyncEvents(RESPONSES)
        return RawResponse(events) if raw else events

    @property
    def with_streaming_response(self) -> Any:
        if "with_streaming_response" not in self.__dict__:
            create = self.create

            def streamed(**kwargs: Any) -> Any:
                return create(**kwargs, extra_headers={"X-Stainless-Raw-Response": "stream"})

            self.__dict__["with_streaming_response"] = type("WithStreaming", (), {"create": staticmethod(streamed)})()
        return self.__dict__["with_streaming_response"]


async def _agents_run(provider: TracerProvider, client: Any) -> tuple[int, int]:
    """As the OpenAI Agents SDK streams a run: its ``response`` span (an agents instrumentation's, not made current)
    around ``client.responses.with_streaming_response.create``, the raw response entered, parsed and read."""
    agents = provider.get_tracer("openinference.instrumentation.openai_agents")
    span = agents.start_span("response", attributes={"openinference.span.kind": "LLM"})
    started = time.time_ns()
    response = await client.responses.with_streaming_response.create(model="gpt-x", stream=True)
    first = 0
    async for event in await response.parse():
        if not first and event.type.endswith(".delta"):
            first = time.time_ns()
    await response.close()
    span.end()
    assert response.closed and response.request_id == "req_1"
    return started, first


def test_a_with_streaming_response_call_is_timed_on_the_stream_its_parse_gives() -> None:
    """The OpenAI Agents SDK's path: the raw response's parsed stream is timed; the client's span ended with the
    headers, so the first chunk goes on the agents ``response`` span, which still records (before: ``errors`` 2,
    no first chunk anywhere: ``no_first_chunk`` for every streamed run)."""
    provider, exported, timing = _provider()
    client = type("AsyncClient", (), {})()
    client.responses = StainlessResponses(provider)
    _ = client.responses.with_streaming_response  # read before the helper: it must not keep the unwrapped create
    timing.instrument(client)
    started, first = asyncio.run(_agents_run(provider, client))
    (outer,) = _spans(exported, "response")
    (inner,) = _spans(exported, "Response")
    assert FIRST_CHUNK_ATTR not in (inner.attributes or {})
    measured_ns = outer.start_time + _first_chunk_s(outer) * 1e9  # type: ignore[operator]
    assert first - 2_000_000 <= measured_ns <= first and first - started >= FIRST_TOKEN_S * 1e9
    assert (outer.attributes or {})[STREAM_ATTR] is True
    assert timing.stats.first_chunks == 1 and timing.stats.errors == 0
