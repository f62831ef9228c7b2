"""What the instrumentation conventions say about one span, read from its attributes and events (pure).

The OpenTelemetry input (docs/design.md, "OpenTelemetry spans") meets spans made by several instrumentations,
each with its own names: OpenInference (``openinference.span.kind``, ``llm.*``), the GenAI semantic
conventions (``gen_ai.*``), OpenLLMetry (GenAI names plus one event per streamed chunk), OpenLIT and Strands
(``gen_ai.server.time_to_first_token`` on the span) and the Vercel AI SDK (``ai.*``). This module knows
those names, and nothing else does: which stage a span is, whether an LLM call streamed, when its first
chunk came, and its token counts. ``docs/otlp-mapping.md`` has the table of libraries each was tested with.

Nothing here raises on what a span says: a value that is not a finite number in range (NaN, Infinity, a
negative or a first-chunk attribute past the span's end) is ignored, and :class:`FirstChunk` says why, so the caller
can dead-letter the span with that reason instead of failing the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import orjson

from schemas.otlp import AttrValue, OtlpSpan
from schemas.vocabulary import is_stage_name

#: ``openinference.span.kind`` -> stage (``EMBEDDING`` only inside a retriever, see :data:`EMBEDDING`).
OPENINFERENCE_STAGES: Final[dict[str, str]] = {
    "RETRIEVER": "retrieval",
    "RERANKER": "rerank",
    "PROMPT": "prompt_assemble",
    "LLM": "llm_ttft",
}
#: ``gen_ai.operation.name`` -> stage (``embeddings`` only inside a retrieval, see :data:`EMBEDDING`).
GEN_AI_STAGES: Final[dict[str, str]] = {
    "retrieval": "retrieval",
    "vector_db_retrieve": "retrieval",  # OpenLLMetry's LangChain retrievers
    "chat": "llm_ttft",
    "text_completion": "llm_ttft",
    "generate_content": "llm_ttft",
    "acompletion": "llm_ttft",  # LiteLLM's own callback names an async call so (``USE_OTEL_LITELLM_REQUEST_SPAN``)
}
#: Spring AI's observations (2.0.1, through Micrometer Tracing's OpenTelemetry bridge): a vector store's search is
#: ``spring.ai.kind = vector_store`` with ``db.operation.name = query`` (no GenAI operation: every request was
#: ``missing_stage`` without its retrieval), its embedding call ``gen_ai.operation.name = embedding``; Micrometer
#: writes every tag as a string (token counts too).
SPRING_AI_KIND: Final = "spring.ai.kind"
SPRING_AI_SEARCH: Final = "spring.ai.kind = vector_store, db.operation.name = query"
#: The ``gen_ai.operation.name`` of an embedding call: the conventions' ``embeddings``, Spring AI's ``embedding``.
EMBEDDING_OPERATIONS: Final = frozenset({"embeddings", "embedding"})
#: OpenLLMetry's older name for the operation, read when ``gen_ai.operation.name`` is absent: its Mistral
#: instrumentation (0.62.4, mistralai 1.x) writes only ``llm.request.type = chat`` (no LLM span before: timed_out).
LEGACY_REQUEST_TYPE: Final = "llm.request.type"
#: Vercel AI SDK provider-call spans (``ai.operationId``) -> whether the call streams.
VERCEL_LLM_OPERATIONS: Final[dict[str, bool]] = {
    "ai.streamText.doStream": True,
    "ai.streamObject.doStream": True,
    "ai.generateText.doGenerate": False,
    "ai.generateObject.doGenerate": False,
}
#: Haystack's own tracing (``haystack.component.run`` spans; ``opentelemetry-haystack`` 2.0 for Haystack 3.4) names
#: each pipeline component's class in ``haystack.component.type``: class-name suffix -> stage, first match wins.
HAYSTACK_COMPONENT_STAGES: Final = (
    ("Retriever", "retrieval"),  # InMemoryBM25Retriever, QdrantEmbeddingRetriever, ...
    ("Ranker", "rerank"),  # SentenceTransformersSimilarityRanker, ...
    ("PromptBuilder", "prompt_assemble"),  # PromptBuilder, ChatPromptBuilder
    ("Generator", "llm_ttft"),  # OpenAIChatGenerator, OpenAIGenerator, HuggingFaceAPIChatGenerator, ...
)
HAYSTACK_COMPONENT: Final = "haystack.component.type"
#: OpenLLMetry's LlamaIndex instrumentation (0.62.4) names a span after the component's class and what it is
#: (``VectorIndexRetriever.task``), with ``traceloop.span.kind = task`` and the same ``traceloop.entity.name``:
#: class-name suffix -> stage (its retrievers were no stage before: every request ``missing_stage``).
TRACELOOP_TASK_STAGES: Final = (("Retriever", "retrieval"), ("Rerank", "rerank"))
#: Haystack's component span says what its ``run`` was given, as JSON: a streaming callback is a stream. (One set
#: on the generator itself, not passed to ``run``, shows as ``NoneType``: then the span does not say.)
HAYSTACK_INPUT_TYPES: Final = "haystack.component.input_types"
#: An OpenInference ``LLM`` span with a prompt template and no model, parameters or messages is a prompt's rendering:
#: OpenInference's Haystack instrumentor (0.1.46) gives ``PromptBuilder.run`` the kind ``LLM`` (read as an LLM call
#: before: ``llm_unmeasured`` 0.2-2.2 ms, and the derived prompt assembly cut at its start).
PROMPT_TEMPLATE: Final = "llm.prompt_template.template"
_LLM_CALL_MARKS: Final = ("llm.model_name", "llm.invocation_parameters", "llm.input_messages.0.message.role")
#: The provisional stage of an embedding span: ``vector_recall`` if a retrieval span encloses it.
EMBEDDING: Final = "~embedding"
#: The provisional stage of a tool's span (held with the trace, never a stage): an LLM turn that a tool span
#: and another LLM call follow is an agent's step (:func:`streams.core.otlp_mapping.agent_steps`).
TOOL_CALL: Final = "~tool"
#: ttft-emit's helper's first-chunk attribute (seconds): set at the first chunk of output.
OWN_FIRST_CHUNK_ATTR: Final = "ttft_emit.time_to_first_chunk"
#: First-chunk attributes, first found wins: (name, nanoseconds per unit).
FIRST_CHUNK_ATTRS: Final = (
    # ttft-emit's helper, seconds: beside the GenAI attribute, which an instrumentation may overwrite after it
    # (util-genai 1.3b0 writes its own when the stream ends).
    (OWN_FIRST_CHUNK_ATTR, 1e9),
    ("gen_ai.response.time_to_first_chunk", 1e9),  # GenAI semantic conventions, seconds
    ("gen_ai.server.time_to_first_token", 1e9),  # OpenLIT, Strands: seconds
    ("ai.response.msToFirstChunk", 1e6),  # Vercel AI SDK: milliseconds
    # Pydantic AI (2.78) on its chat span, seconds, under the GenAI client metric's name; from just before the
    # request, so 1.2-1.7 ms short of the client's TTFT on its captures.
    ("gen_ai.client.operation.time_to_first_chunk", 1e9),
)
#: What :func:`first_chunk` says of a first-chunk attribute longer than its span. OpenLIT (1.45) exports a streamed
#: call's span only as a 0.2-0.4 ms span made after the stream ended, with the whole time to first token on it: its
#: start is not the call's (:func:`streams.core.otlp_mapping.prompt_plan` derives no prompt assembly up to it).
PAST_END: Final = "is after the span's end"
#: Span events that mark a first chunk; the earliest one within the span counts.
FIRST_CHUNK_EVENTS: Final = frozenset(
    {
        "gen_ai.first_chunk",
        "First Token Stream Event",  # OpenInference
        "gen_ai.content.completion.chunk",  # OpenLLMetry: one per chunk
        "ai.stream.firstChunk",  # Vercel AI SDK
    }
)
#: How long after an LLM span's end a first-chunk event still counts (a span ended before its stream: LlamaIndex).
LATE_FIRST_CHUNK_NS: Final = 600 * 1_000_000_000
#: (scope, span name) of LLM spans whose first-chunk *events* mark no token. OpenInference's OpenAI instrumentor
#: (0.1.66) adds ``First Token Stream Event`` at a stream's first server-sent event; on the Responses API
#: (``responses.create``, its span named after the ``Response`` type) that is ``response.created``, sent when the
#: request is accepted: taken as the first chunk, a TTFT 120 ms short was stored as ``complete``. Attributes
#: still count (ttft-emit's helper sets one at the first output delta).
EVENTS_MARK_NO_TOKEN: Final[dict[tuple[str, str], str]] = {
    ("openinference.instrumentation.openai", "Response"): (
        "First Token Stream Event marks the Responses API's first server event (response.created), not its "
        "first token: ignored"
    ),
}
#: (scope, first-chunk attribute) pairs whose value marks no token. OpenLIT's Anthropic instrumentation (1.45.0)
#: starts its clock when ``create()`` returns (the response headers) and stops it at the first server-sent event,
#: ``message_start``, sent with the headers: 8-14 ms stored for a first text 126 ms after the call, ``complete``.
ATTRS_MARK_NO_TOKEN: Final[dict[tuple[str, str], str]] = {
    ("openlit.instrumentation.anthropic", "gen_ai.server.time_to_first_token"): (
        "OpenLIT's Anthropic time to first token runs from the response headers to message_start, not to the "
        "first token: ignored"
    ),
    ("opentelemetry.instrumentation.genai.openai", "gen_ai.response.time_to_first_chunk"): (
        "OpenTelemetry's GenAI OpenAI instrumentation times a Responses API stream to its first server event "
        "(response.created), not its first token: ignored"
    ),
}
#: The pairs of :data:`ATTRS_MARK_NO_TOKEN` that mark no token only on some spans: (attribute, value) the span must
#: have. ``opentelemetry-instrumentation-genai-openai`` (1.3b0, util-genai 1.3b0) counts every server-sent event of
#: a stream as a chunk: right on chat completions, but on the Responses API the first is ``response.created``, sent
#: when the request is accepted (5-14 ms stored for a first text 130 ms after the call, ``complete``).
ATTRS_MARK_NO_TOKEN_ONLY_IF: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("opentelemetry.instrumentation.genai.openai", "gen_ai.response.time_to_first_chunk"): (
        "openai.api.type",
        "responses",
    ),
}
#: Azure OpenAI sends a stream's content-filter verdict on the prompt first, a chunk with no choices
#: (``prompt_filter_results``), once the prompt is filtered and before generation. These instrumentations take the
#: first chunk of any kind as the first token (captured against a stub sending it 120 ms before the first content,
#: ``capture_prefill_chunks.py``: OpenInference's ``First Token Stream Event``, OpenLLMetry's first chunk event and
#: genai-openai's ``time_to_first_chunk`` all at the filter chunk: stored ``complete`` 120 ms early). On an Azure
#: OpenAI span of theirs only ttft-emit's own attribute (set at the first output chunk) tells the first chunk.
AZURE_FILTER_CHUNK_SCOPES: Final = frozenset(
    {
        "openinference.instrumentation.openai",
        "opentelemetry.instrumentation.openai.v1",  # OpenLLMetry
        "opentelemetry.instrumentation.openai",
        "opentelemetry.instrumentation.genai.openai",
        "opentelemetry.instrumentation.openai_v2",
        "opentelemetry.util.genai.handler",
    }
)
#: How those instrumentations name Azure OpenAI (0.1.66, 0.62.4, 1.3b0 on ``openai.AzureOpenAI``): OpenInference's
#: ``llm.provider``, OpenLLMetry's provider and API version, genai-openai's ``server.address`` only.
AZURE_PROVIDERS: Final = frozenset({"azure", "azure.ai.openai", "az.ai.openai"})
AZURE_HOST_SUFFIXES: Final = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")
#: OpenLLMetry's copy of the filter chunk's verdicts (content capture on): the stream had one, whatever the host.
PROMPT_FILTER_RESULTS: Final = "gen_ai.prompt.prompt_filter_results"
AZURE_FILTER_CHUNK: Final = (
    "Azure OpenAI sends its prompt filter results (a chunk with no choices) before the first token, and this "
    "instrumentation counts it as the first chunk: ignored"
)


def is_azure_openai(a: Mapping[str, AttrValue]) -> bool:
    """Whether an LLM span's attributes name Azure OpenAI (:data:`AZURE_PROVIDERS`, an Azure API version, an Azure
    endpoint's host) or hold its prompt filter results (:data:`PROMPT_FILTER_RESULTS`)."""
    for name in ("llm.provider", "gen_ai.provider.name", "gen_ai.system"):
        value = a.get(name)
        if isinstance(value, str) and value.lower() in AZURE_PROVIDERS:
            return True
    if "gen_ai.openai.api_version" in a or PROMPT_FILTER_RESULTS in a:  # OpenLLMetry: Azure clients only
        return True
    for name in ("server.address", "gen_ai.openai.api_base"):
        value = a.get(name)
        if isinstance(value, str) and value:
            host = value.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0].lower()
            if host.endswith(AZURE_HOST_SUFFIXES):
                return True
    return False


#: Frameworks whose streamed output reaches the caller later than the model's first chunk, by the scope of any span
#: of theirs in the trace -> why. DSPy (3.4, OpenInference's instrumentor 0.1.48) streams its output fields' markers
#: first (``[[ ## answer ## ]]``) and, in ``ReAct``'s extract step, the ``reasoning`` field; the caller's
#: ``StreamListener`` gives the listened field's first token 61-66 ms later on the captures, 304-310 ms in ReAct.
#: Taken as the first token, those requests were stored ``complete`` that much early. A streamed call in such a trace
#: tells no first token (``llm_unmeasured``) unless the trace marks one (``ttft.stage = first_token``).
FIRST_CHUNK_HIDDEN_BY_SCOPE: Final[dict[str, str]] = {
    "openinference.instrumentation.dspy": (
        "DSPy streams its output field markers (and other fields) before the listened field's first token: the "
        "model's first chunk is not the caller's; ignored"
    ),
}
#: Scopes whose LLM spans tell a streaming call only one way, so that not telling it means a plain call:
#: scope (or its prefix before a ``.``) -> the stream flag's value when absent. OpenTelemetry's google-genai
#: instrumentation (1.3b0) sets ``gen_ai.request.stream`` only in its stream wrapper, and the anthropic SDK's
#: own tracing (2.17.0; ``com.anthropic.sdk.python``, ``.bedrock`` and other platforms after it) only on a
#: streaming call: neither ever sets ``False``.
STREAM_FLAG_ABSENT_MEANS: Final[dict[str, bool]] = {
    "opentelemetry.instrumentation.google_genai": False,
    "com.anthropic.sdk.python": False,
    "litellm": False,  # LiteLLM's own callback with the latest GenAI conventions (1.110): only a stream is told
    "pydantic-ai": False,  # Pydantic AI (2.78) sets no stream flag; a stream has its time to first chunk
    # OpenTelemetry's GenAI instrumentations on util-genai 1.3b0 (``….genai.openai``, ``….genai.langchain``): the
    # flag is set when a chunk is recorded, never ``False`` (their plain calls were ``no_first_chunk``).
    "opentelemetry.instrumentation.genai": False,
}
#: Flags on a caller's span that tell whether the LLM calls under it stream (a bool or ``"true"`` / ``"false"``):
#: Spring AI's ChatClient span (1.1 and 2.0) says ``spring.ai.chat.client.stream``, ``call()`` or ``stream()``, where
#: Spring AI 1.1's chat model span under it tells nothing (:func:`caller_streaming`).
CALLER_STREAM_FLAGS: Final = ("spring.ai.chat.client.stream",)
#: The same from a scope version on (major). Spring Boot's Micrometer Tracing bridge (scope
#: ``org.springframework.boot``, the Boot version) carries Spring AI's chat model observation. Spring AI 2.0 (Boot 4
#: only) tags a stream ``gen_ai.request.stream = "true"`` and a plain call not at all (its plain calls were
#: ``no_first_chunk``); Spring AI 1.1 (Boot 3) tags neither, so there an absent flag tells nothing (a stream read
#: as plain would be stored ``complete`` at its last chunk).
STREAM_FLAG_ABSENT_MEANS_FROM: Final[dict[str, tuple[int, bool]]] = {"org.springframework.boot": (4, False)}
#: Scopes whose LLM spans tell whether the call streamed by something other than a flag: scope -> the rule
#: (``None``: it does not say). OpenInference's google-genai (1.4.14), Bedrock (0.1.61) and LlamaIndex (4.6.1)
#: instrumentors name their spans after the method (``GenerateContentStream``, ``bedrock.converse_stream``,
#: ``OpenAI.stream_chat``; ``GenerateContent``, ``bedrock.converse``, ``OpenAI.chat``), and their
#: ``llm.invocation_parameters``, when set, are the generation config or the model's metadata, never with a
#: ``stream`` key: read as a plain call, a Bedrock stream was stored as a ``complete`` request whose TTFT was the
#: whole stream (324.3 ms for 201.4). OpenTelemetry's botocore instrumentation (0.66b2) names the API operation in
#: ``rpc.method`` (``ConverseStream``, ``InvokeModelWithResponseStream``; ``Converse``, ``InvokeModel``).
STREAMING_BY_SCOPE: Final[dict[str, Callable[[OtlpSpan], bool | None]]] = {}
#: The OpenInference scopes whose ``llm.invocation_parameters`` are the request's own, so that no ``stream`` key
#: means the API's default, a plain call (checked on captures). Other OpenInference scopes do not say.
OPENINFERENCE_STREAM_KEY_SCOPES: Final = frozenset(
    {
        "openinference.instrumentation.openai",
        "openinference.instrumentation.anthropic",
        "openinference.instrumentation.langchain",
        "openinference.instrumentation.litellm",  # the call's own keyword arguments (0.1.51)
        "openinference.instrumentation.groq",  # the same (0.1.33): its plain calls were no_first_chunk
    }
)


#: Boolean attributes that say whether an LLM call streamed, first found wins (a bool, or the strings ``"True"`` /
#: ``"False"`` in any case: LiteLLM's own callback, 1.110, writes ``llm.is_streaming = str(stream)``).
STREAM_FLAGS: Final = ("gen_ai.is_streaming", "llm.is_streaming", "gen_ai.request.stream")
_FLAG_STRINGS: Final = {"true": True, "false": False}
#: OpenInference keeps the request's parameters as JSON; ``stream`` absent means the API default, no stream (on
#: :data:`OPENINFERENCE_STREAM_KEY_SCOPES` and spans of no OpenInference scope).
INVOCATION_PARAMETERS: Final = "llm.invocation_parameters"
_MAX_PARAMETERS_CHARS: Final = 65_536
#: Token-count attributes -> the request attr they fill, first match wins.
TOKEN_ATTRS: Final[dict[str, tuple[str, ...]]] = {
    "prompt_tokens": (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "llm.token_count.prompt",
        "ai.usage.inputTokens",  # Vercel AI SDK
        "ai.usage.promptTokens",  # Vercel AI SDK before 5
    ),
    "cached_tokens": (
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",
        "gen_ai.usage.cached_tokens",
        "llm.token_count.prompt_details.cache_read",
        "ai.usage.cachedInputTokens",  # Vercel AI SDK
        "ai.usage.inputTokenDetails.cacheReadTokens",
    ),
}
_MAX_TOKENS: Final = 10_000_000
#: The model of an LLM span, first found wins (the ``route`` when no ``ttft.route`` is set).
MODEL_ATTRS: Final = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")


def _name_says_stream(span: OtlpSpan) -> bool:
    return "stream" in span.name.lower()


def _url_says_stream(span: OtlpSpan) -> bool:
    """The Mistral SDK's own tracing (mistralai 3.7, scope ``mistralai_sdk_tracer``) sets no stream flag; its
    ``http.url`` ends in ``#stream`` on a streamed call."""
    url = span.attributes.get("http.url")
    return isinstance(url, str) and url.endswith("#stream")


def _rpc_method_says_stream(span: OtlpSpan) -> bool | None:
    method = span.attributes.get("rpc.method")
    return method.endswith("Stream") if isinstance(method, str) else None


STREAMING_BY_SCOPE.update(
    {
        "openinference.instrumentation.google_genai": _name_says_stream,
        "openinference.instrumentation.bedrock": _name_says_stream,
        "openinference.instrumentation.llama_index": _name_says_stream,
        "opentelemetry.instrumentation.botocore.bedrock-runtime": _rpc_method_says_stream,
        "mistralai_sdk_tracer": _url_says_stream,
    }
)


#: Attributes LiteLLM's own callback (1.110) writes onto whatever span is current when it makes no span of its own
#: (its default mode since 1.81): the service's request span, say, then named an LLM call (``gen_ai.operation.name``)
#: that ran from the request's start to its end, and only when that span had not ended yet (else they are
#: dropped: a race). A span of another scope that carries one is the service's own, never an LLM call.
BORROWED_BY: Final[dict[str, str]] = {"litellm.call_id": "litellm"}


def borrowed(span: OtlpSpan) -> bool:
    """Whether another library wrote its LLM call's attributes onto ``span`` (:data:`BORROWED_BY`)."""
    return any(name in span.attributes and span.scope_name != scope for name, scope in BORROWED_BY.items())


#: Attributes that make a span a log record, never a stage: Logfire (5.4) writes, after a stream, a zero-length span
#: ``streaming response from … took …`` with ``logfire.span_type = log`` and the call's ``gen_ai.operation.name``
#: (read as a second LLM call of 0 ms before).
LOG_SPAN_MARKS: Final[dict[str, str]] = {"logfire.span_type": "log"}


def not_a_stage(span: OtlpSpan) -> bool:
    """A span that names a stage but is none: another library's call written onto it (:func:`borrowed`), or a log
    record (:data:`LOG_SPAN_MARKS`). Read for every span: two lookups when it is neither."""
    a = span.attributes
    if _MARK_A not in a and _MARK_B not in a:
        return False
    return borrowed(span) or any(a.get(name) == value for name, value in LOG_SPAN_MARKS.items())


_MARK_A, _MARK_B = (*BORROWED_BY, *LOG_SPAN_MARKS)  # the two marks (a third needs a third lookup here)


def span_stage(a: dict[str, AttrValue]) -> str | None:
    """The stage a span's attributes name: ``ttft.stage``, else its OpenInference kind, its GenAI operation
    or a Vercel AI SDK provider call; :data:`EMBEDDING` for an embedding span; ``None`` for no stage."""
    return stage_and_source(a)[0]


def stage_and_source(a: dict[str, AttrValue]) -> tuple[str | None, str]:
    """:func:`span_stage` and the attribute that named it (``"openinference.span.kind = RETRIEVER"``; empty
    for no stage), as ``ttft otel check`` reports it."""
    explicit = a.get("ttft.stage")
    if isinstance(explicit, str) and is_stage_name(explicit):
        return explicit, f"ttft.stage = {explicit}"
    kind = a.get("openinference.span.kind")
    if isinstance(kind, str):
        if kind == "EMBEDDING":
            return EMBEDDING, "openinference.span.kind = EMBEDDING"
        if kind == "TOOL":
            return TOOL_CALL, "openinference.span.kind = TOOL"
        if kind == "LLM" and PROMPT_TEMPLATE in a and not any(name in a for name in _LLM_CALL_MARKS):
            return "prompt_assemble", "openinference.span.kind = LLM, a prompt template and no model"
        if kind in OPENINFERENCE_STAGES:
            return OPENINFERENCE_STAGES[kind], f"openinference.span.kind = {kind}"
    named_by = "gen_ai.operation.name"
    operation = a.get(named_by)
    if operation is None:
        named_by = LEGACY_REQUEST_TYPE
        operation = a.get(named_by)
    if isinstance(operation, str):
        if operation in EMBEDDING_OPERATIONS:
            return EMBEDDING, f"{named_by} = {operation}"
        if operation == "execute_tool":
            return TOOL_CALL, f"{named_by} = execute_tool"
        if operation in GEN_AI_STAGES:
            return GEN_AI_STAGES[operation], f"{named_by} = {operation}"
    if is_spring_ai_search(a):
        return "retrieval", SPRING_AI_SEARCH
    operation_id = a.get("ai.operationId")
    if isinstance(operation_id, str) and operation_id in VERCEL_LLM_OPERATIONS:
        return "llm_ttft", f"ai.operationId = {operation_id}"
    traceloop_kind = a.get("traceloop.span.kind")
    if operation_id == "ai.toolCall" or traceloop_kind == "tool":
        return TOOL_CALL, "a tool's span"
    if traceloop_kind == "task":
        entity = a.get("traceloop.entity.name")
        stage = _by_suffix(TRACELOOP_TASK_STAGES, entity.removesuffix(".task")) if isinstance(entity, str) else None
        if stage is not None:
            return stage, f"traceloop.entity.name = {entity!s:.64}"
    component = a.get(HAYSTACK_COMPONENT)
    stage = _by_suffix(HAYSTACK_COMPONENT_STAGES, component) if isinstance(component, str) else None
    if stage is not None:
        return stage, f"{HAYSTACK_COMPONENT} = {component!s:.64}"
    return None, ""


def is_spring_ai_search(a: dict[str, AttrValue]) -> bool:
    """A Spring AI vector store's similarity search (not its ``add`` or ``delete``)."""
    return a.get(SPRING_AI_KIND) == "vector_store" and a.get("db.operation.name") == "query"


def _by_suffix(table: tuple[tuple[str, str], ...], name: str) -> str | None:
    """The stage of the first ``(suffix, stage)`` of ``table`` that ``name`` ends with."""
    return next((stage for suffix, stage in table if name.endswith(suffix)), None)


def is_retriever(a: dict[str, AttrValue], named: str | None) -> bool:
    """A retrieval span by its kind, operation or name (an embedding span inside it is ``vector_recall``); ``named``:
    the stage its attributes name (:func:`span_stage`), so that they are read once."""
    kind, operation = a.get("openinference.span.kind"), a.get("gen_ai.operation.name")
    if kind == "RETRIEVER" or (isinstance(operation, str) and GEN_AI_STAGES.get(operation) == "retrieval"):
        return True
    if named == "retrieval" and is_spring_ai_search(a):
        return True
    return named == "retrieval" and ("traceloop.span.kind" in a or HAYSTACK_COMPONENT in a)


@dataclass(frozen=True, slots=True)
class FirstChunk:
    """When an LLM span's first chunk came (``at_ns``, None when the span does not say), which attribute or
    event said so (``source``), and what was ignored on the way (``problem``, empty when nothing was)."""

    at_ns: int | None
    source: str = ""
    problem: str = ""


def first_chunk(span: OtlpSpan) -> FirstChunk:
    """The first chunk of an LLM span: the first valid attribute of :data:`FIRST_CHUNK_ATTRS` (time after
    the span's start, within the span), else the earliest :data:`FIRST_CHUNK_EVENTS` event from the span's
    start to :data:`LATE_FIRST_CHUNK_NS` after its end. Never raises."""
    start, end = span.start_ns, span.end_ns
    longest = end - start if end >= start else None
    problems: list[str] = []
    azure = span.scope_name in AZURE_FILTER_CHUNK_SCOPES and is_azure_openai(span.attributes)
    for name, ns_per_unit in FIRST_CHUNK_ATTRS:
        if name not in span.attributes:
            continue
        if azure and name != OWN_FIRST_CHUNK_ATTR:
            problems.append(AZURE_FILTER_CHUNK)
            continue
        not_a_token = ATTRS_MARK_NO_TOKEN.get((span.scope_name, name))
        only_if = ATTRS_MARK_NO_TOKEN_ONLY_IF.get((span.scope_name, name))
        if not_a_token is not None and (only_if is None or span.attributes.get(only_if[0]) == only_if[1]):
            problems.append(not_a_token)
            continue
        value = span.attributes[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{name} = {value!r:.64} is not a number")
            continue
        if not math.isfinite(value) or value < 0:
            problems.append(f"{name} = {value!r} is not a finite number >= 0")
            continue
        after = value * ns_per_unit
        if longest is None or after > longest:  # (a span that ends before it starts has no time within it)
            problems.append(f"{name} = {value!r} {PAST_END}")
            continue
        return FirstChunk(start + round(after), name, "; ".join(problems))
    ignored = AZURE_FILTER_CHUNK if azure else EVENTS_MARK_NO_TOKEN.get((span.scope_name, span.name))
    if ignored is not None:
        if any(e.name in FIRST_CHUNK_EVENTS for e in span.events):
            problems.append(ignored)
        return FirstChunk(None, "", "; ".join(problems))
    times = [e.time_ns for e in span.events if e.name in FIRST_CHUNK_EVENTS]
    # An event after the span's end counts: OpenInference's LlamaIndex instrumentor ends a streaming call's span
    # when the stream is handed back, then adds the first chunk's event (and ends it with the earlier time).
    last = max(end, start) + LATE_FIRST_CHUNK_NS
    inside = [t for t in times if start <= t <= last]
    if inside:
        earliest = min(inside)
        name = next(e.name for e in span.events if e.name in FIRST_CHUNK_EVENTS and e.time_ns == earliest)
        return FirstChunk(earliest, name, "; ".join(problems))
    if times:
        problems.append(
            f"{len(times)} first-chunk event(s) outside the span's time (before its start, or over "
            f"{LATE_FIRST_CHUNK_NS // 1_000_000_000} s after its end)"
        )
    return FirstChunk(None, "", "; ".join(problems))


#: Finish reasons of a model turn that ended by asking for tools (OpenAI ``tool_calls`` / ``function_call``,
#: Anthropic ``tool_use``, the Vercel AI SDK's ``tool-calls``).
TOOL_FINISH_REASONS: Final = frozenset({"tool_calls", "tool_call", "function_call", "tool_use", "tool-calls"})
#: Where an LLM span says why its turn finished: a string, or a list of strings (GenAI
#: ``gen_ai.response.finish_reasons``), per convention.
FINISH_REASON_ATTRS: Final = (
    "gen_ai.response.finish_reasons",  # GenAI semantic conventions (openai-v2, the anthropic SDK, Pydantic AI)
    "llm.finish_reason",  # OpenInference
    "gen_ai.completion.0.finish_reason",  # OpenLLMetry
    "llm.response.finish_reason",
    "ai.response.finishReason",  # Vercel AI SDK
    "anthropic.message.stop_reason",
    "gen_ai.response.finish_reason",  # Semantic Kernel 1.45: its enum's name, "FinishReason.TOOL_CALLS"
)


_MAX_REASONS_CHARS: Final = 1024


def asked_for_tools(a: dict[str, AttrValue]) -> bool:
    """Whether an LLM span's turn ended by asking for tools (:data:`FINISH_REASON_ATTRS` naming one of
    :data:`TOOL_FINISH_REASONS`): an agent's step, whose first chunk is a tool call, not the answer's first token."""
    for name in FINISH_REASON_ATTRS:
        value = a.get(name)
        if value is None:
            continue
        if isinstance(value, str) and value.startswith("[") and len(value) <= _MAX_REASONS_CHARS:
            try:  # a string array, as JSON text (schemas.otlp keeps it so; some instrumentations write it so)
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                return False
        if isinstance(value, str):
            return _reason(value) in TOOL_FINISH_REASONS
        if isinstance(value, (list, tuple)):
            return any(isinstance(v, str) and _reason(v) in TOOL_FINISH_REASONS for v in value)
    return False


def _reason(value: str) -> str:
    """A finish reason as :data:`TOOL_FINISH_REASONS` spells it: lower case, without an enum's class name."""
    return value.lower().rpartition(".")[2]


def span_streaming(span: OtlpSpan) -> bool | None:
    """Whether an LLM span's call streamed: a stream flag (:data:`STREAM_FLAGS`) if set, else its scope's rule
    (:data:`STREAMING_BY_SCOPE`), else :func:`streaming` (OpenInference's missing ``stream`` key tells a plain call
    only on :data:`OPENINFERENCE_STREAM_KEY_SCOPES`), else what a missing flag means on its scope
    (:data:`STREAM_FLAG_ABSENT_MEANS`)."""
    a, scope = span.attributes, span.scope_name
    for name in STREAM_FLAGS:
        value = _flag(a.get(name))
        if value is not None:
            return value
    rule = STREAMING_BY_SCOPE.get(scope)
    told = None if rule is None else rule(span)
    if told is None:
        key_tells = not scope.startswith("openinference.") or scope in OPENINFERENCE_STREAM_KEY_SCOPES
        told = streaming(a, absent_key_means_plain=key_tells)
    if told is None:
        told = _by_scope(STREAM_FLAG_ABSENT_MEANS, scope)
    if told is None and scope in STREAM_FLAG_ABSENT_MEANS_FROM:
        major, means = STREAM_FLAG_ABSENT_MEANS_FROM[scope]
        told = means if _major(span.scope_version) >= major else None
    return told


def caller_streaming(a: dict[str, AttrValue]) -> bool | None:
    """Whether the LLM calls under a span with attributes ``a`` stream, when it says (:data:`CALLER_STREAM_FLAGS`)."""
    for name in CALLER_STREAM_FLAGS:
        value = _flag(a.get(name))
        if value is not None:
            return value
    return None


def _major(version: str) -> int:
    """The major number of a scope version (``"4.0.7"`` -> 4); -1 when there is none."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() and len(head) <= 6 else -1


def _flag(value: AttrValue | None) -> bool | None:
    if isinstance(value, bool):
        return value
    return _FLAG_STRINGS.get(value.lower()) if isinstance(value, str) and len(value) <= 5 else None


def _by_scope(table: dict[str, bool], scope: str) -> bool | None:
    """``table``'s entry for ``scope``, or for the scope it extends (``com.anthropic.sdk.python.bedrock``)."""
    found = table.get(scope)
    if found is None and "." in scope:
        return _by_scope(table, scope.rsplit(".", 1)[0])
    return found


def streaming(a: dict[str, AttrValue], absent_key_means_plain: bool = True) -> bool | None:
    """Whether an LLM call streamed, as its span says (:data:`STREAM_FLAGS`, a Vercel provider call, or
    OpenInference's invocation parameters: without a ``stream`` key, a plain call if ``absent_key_means_plain``);
    ``None`` when it does not say."""
    for name in STREAM_FLAGS:
        value = _flag(a.get(name))
        if value is not None:
            return value
    operation = a.get("ai.operationId")
    if isinstance(operation, str) and operation in VERCEL_LLM_OPERATIONS:
        return VERCEL_LLM_OPERATIONS[operation]
    inputs = a.get(HAYSTACK_INPUT_TYPES)
    if isinstance(inputs, str) and len(inputs) <= _MAX_PARAMETERS_CHARS:
        return _haystack_streaming(inputs)
    parameters = a.get(INVOCATION_PARAMETERS)
    if isinstance(parameters, str) and len(parameters) <= _MAX_PARAMETERS_CHARS:
        try:
            doc = orjson.loads(parameters)
        except orjson.JSONDecodeError:
            return None
        if isinstance(doc, dict):
            stream = doc.get("stream")
            if isinstance(stream, bool):
                return stream
            if stream is None and absent_key_means_plain:
                return False
    return None


def _haystack_streaming(inputs: str) -> bool | None:
    """A Haystack generator's run streams when it was given a streaming callback (:data:`HAYSTACK_INPUT_TYPES`)."""
    try:
        doc = orjson.loads(inputs)
    except orjson.JSONDecodeError:
        return None
    return True if isinstance(doc, dict) and doc.get("streaming_callback") == "function" else None


def token_attrs(a: dict[str, AttrValue]) -> dict[str, AttrValue]:
    """``prompt_tokens`` and ``cached_tokens`` from either convention's spelling; a count that is not a
    whole number in the contract's range is left out (it would dead-letter the whole LLM span).

    A prompt of 0 tokens is no prompt: it is what instrumentations write when the usage is unknown (Spring AI 1.1's
    empty usage on a stream, OpenAI Agents' chat-completions streams), so it is left out too. Stored, it would
    count the request as below the prompt cache's minimum size (``below_cacheable``)."""
    out: dict[str, AttrValue] = {}
    for target, names in TOKEN_ATTRS.items():
        for name in names:
            count = _count(a.get(name))
            if count == 0 and target == "prompt_tokens":
                continue
            if count is not None:
                out[target] = count
                break
    return out


def _count(value: AttrValue | None) -> int | None:
    if isinstance(value, str) and value.isdigit() and len(value) <= 12:  # Micrometer's tags (Spring AI): strings
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    return value if 0 <= value <= _MAX_TOKENS else None


def model_of(a: dict[str, AttrValue]) -> dict[str, AttrValue]:
    """The model attributes of an LLM span (context: they fill ``route`` when no ``ttft.route`` is set)."""
    return {name: a[name] for name in MODEL_ATTRS if name in a}
