"""``ttft otel check``: what a team's traces become, per instrumentation scope, and what is missing (pure).

Each trace goes through the mapping the worker runs (:class:`streams.core.otlp_traces.TraceAssembler`, which
validates every event as the join decodes it) and then through a join of its own
(:class:`streams.core.join.RequestJoin`), so the status reported is the status the pipeline would store.
What is added here is only the reading of the outcome: which attribute or event gave each stage (the
conventions' own names, :func:`streams.core.otlp_conventions.stage_and_source` and the LLM span's first-chunk
source), and, for every gap, the one-line fix. Traces are grouped by the instrumentation scope (name, version)
of their LLM span, the library a team would have to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from schemas.otlp import OtlpSpan
from schemas.vocabulary import KNOWN_STAGES, LLM_UNMEASURED
from streams.core.join import RequestJoin
from streams.core.otlp_conventions import (
    ATTRS_MARK_NO_TOKEN,
    AZURE_FILTER_CHUNK,
    AZURE_FILTER_CHUNK_SCOPES,
    EMBEDDING,
    EVENTS_MARK_NO_TOKEN,
    FIRST_CHUNK_ATTRS,
    FIRST_CHUNK_HIDDEN_BY_SCOPE,
    OWN_FIRST_CHUNK_ATTR,
    TOOL_CALL,
    borrowed,
    is_azure_openai,
    stage_and_source,
)
from streams.core.otlp_mapping import (
    CONTEXT_ATTRS,
    SpanNote,
    TraceContext,
    agent_steps,
    hidden_first_chunk,
    note_span,
)
from streams.core.otlp_nesting import nested_duplicates, partner
from streams.core.otlp_outputs import ForwardedEvent
from streams.core.otlp_traces import LOST_MARK_DETAIL, TraceAssembler, starts_at_stage
from streams.settings import CapsConfig, JoinConfig, OtlpConfig

_TOPIC: Final = "otlp_spans"
_WINDOW_MS: Final = 60_000
_NS_PER_MS: Final = 1_000_000
#: The group of traces without an LLM span (no instrumentation scope to blame).
NO_LLM_SCOPE: Final = ("(no LLM span)", "")
#: The status of a trace none of whose spans is a stage (a health check, another endpoint): no request is stored.
NOT_A_REQUEST: Final = "no stage span: not a request"
#: Trace ids kept per missing item.
EXAMPLES: Final = 3
_ATTR_SOURCES: Final = frozenset(name for name, _ in FIRST_CHUNK_ATTRS)
#: What is missing -> the one-line fix a team applies (docs/otlp-mapping.md has the recipes).
FIXES: Final[dict[str, str]] = {
    "first chunk": "the LLM span tells no first chunk: set gen_ai.response.time_to_first_chunk (seconds) on it "
    "when the first chunk arrives; for the openai, anthropic, google-genai and boto3 bedrock-runtime clients "
    "and the litellm module, ttft_emit.otel.time_first_chunk(client) does (docs/otlp-mapping.md, 'The helper')",
    "first-token mark without its request": "a span ttft.stage = first_token with no parent is a trace of its "
    "own (dead-lettered): the service marked it where the request's context was lost (an async callback, another "
    "thread). Give the mark the request's context as its parent (Java: Context.current() taken before the "
    "callback, spanBuilder.setParent(context); Python and Node: mark inside the request's context)",
    "tenant": "set tenant.id on the resource in the Collector (a resource or transform processor: "
    "docs/otlp-mapping.md, 'The tenant with the Collector alone')",
    "request_start": "the trace has no root span (still running, or not exported): check again once the requests ended",
    "retrieval": "mark the retrieval span: openinference.span.kind = RETRIEVER or gen_ai.operation.name = "
    "retrieval (or ttft.stage = retrieval)",
    "prompt_assemble": "a span with openinference.span.kind = PROMPT or ttft.stage = prompt_assemble (derived "
    "only when a retrieval or rerank span ends before the LLM span)",
    "llm_ttft": "no LLM span: instrument the model client (OpenInference, OpenLLMetry or the GenAI "
    "conventions), or set ttft.stage = llm_ttft on the call's span. An instrumentation that does not cover the "
    "method called (openai-v2 2.4b0 and the Responses API): ttft_emit.otel.time_first_chunk(client, "
    "fill_missing=True) gives such calls an LLM span of its own",
    "stream flag": "the LLM span does not say whether the call streamed: set gen_ai.request.stream (a call "
    "that did not stream then counts its whole duration, exactly; the same helper sets it)",
    "first_token": "the LLM span's first chunk gives it (see 'first chunk'), or a span with ttft.stage = first_token",
    "first chunk from the response headers": "OpenLIT's gen_ai.server.time_to_first_token on a streaming call "
    "counts from when the response headers arrived, not from the span's start: llm_ttft and ttft are short by "
    "the request's round trip (8.5 ms on loopback, more to a remote provider). ttft_emit.otel.time_first_chunk("
    "client) sets gen_ai.response.time_to_first_chunk from the span's start, which wins (docs/otlp-mapping.md)",
}
FIXES["first token shown later"] = (
    "the framework shows the caller its first token after the model's first chunk (DSPy's StreamListener): "
    "mark it in the service, a zero-length span with ttft.stage = first_token when the first StreamResponse "
    "reaches the caller: ttft_emit.otel_marks.first_token_marked(stream) around the caller's iteration does "
    "(docs/otlp-mapping.md)"
)
#: What a first chunk marked by :data:`AZURE_FILTER_CHUNK_SCOPES` is, shown beside its source: a role-only chunk sent
#: before generation (LLM gateways, older vLLM, Hugging Face streamer servers) would be taken for the first token.
ANY_CHUNK: Final = " (the first chunk of any kind, with output or not: ttft_emit.otel.time_first_chunk counts output)"
#: A missing first chunk on Azure OpenAI: the client instrumentations' marks count its prompt filter chunk.
AZURE_FIRST_CHUNK: Final = "first chunk (Azure OpenAI)"
FIXES[AZURE_FIRST_CHUNK] = (
    "Azure OpenAI sends its prompt filter results before the first token, and the OpenAI instrumentations that "
    "mark a first chunk count it (ignored): ttft_emit.otel.time_first_chunk(client) on the OpenAI client times "
    "the first chunk of output (fill_missing=True where the client's span ends with the response headers: "
    "OpenLLMetry's under LiteLLM's Azure path) (docs/otlp-mapping.md)"
)
#: A trace whose LLM call was written onto another span (:func:`streams.core.otlp_conventions.borrowed`).
BORROWED_CALL: Final = "LLM call written onto another span"
FIXES[BORROWED_CALL] = (
    "LiteLLM's otel callback wrote its call's attributes onto a span of the service (its default mode; dropped "
    "if that span had ended), so the trace has no LLM span: ttft_emit.otel.time_first_chunk(litellm, "
    "fill_missing=True) gives each call an exact LLM span of its own (USE_OTEL_LITELLM_REQUEST_SPAN=true gives "
    "one with no first chunk)"
)
#: A trace that starts at a stage span: one stage span and nothing else, or a retrieval (rerank, embedding) with no
#: LLM span. A request's parts that arrived as traces of their own: Spring Boot 4's OpenTelemetry starter under the
#: Java agent (every span a root), Spring AI without Reactor's context propagation (a stream's vector store search),
#: LiteLLM's callback during a stream (captured). An LLM span with children at the root is a script's call: not named.
LONE_SPAN: Final = "a trace that starts at a stage span"
FIXES[LONE_SPAN] = (
    "if this span is part of a request, the request's OpenTelemetry context did not reach it and each part is a "
    "trace (and a request) of its own: run one OpenTelemetry, either the Java agent or Spring Boot's "
    "OpenTelemetry starter, not both; set spring.reactor.context-propagation=auto for Reactor; wrap thread pools "
    "with Context.taskWrapping (a batch job's single call is fine as it is)"
)
#: OpenLIT's first-chunk attribute: on a streaming call it counts from the response headers.
HEADERS_FIRST_CHUNK: Final = "gen_ai.server.time_to_first_token"

#: The first-chunk fix for instrumentations whose LLM spans never tell one, by scope name.
FIRST_CHUNK_FIXES_BY_SCOPE: Final[dict[str, str]] = {
    "openinference.instrumentation.langchain": "OpenInference's LangChain spans tell no first chunk: instrument "
    "the model client too (openinference-instrumentation-openai's OpenAIInstrumentor beside the "
    "LangChainInstrumentor); its ChatCompletion span tells it, and the LangChain LLM span around it is counted "
    "once (docs/otlp-mapping.md, 'Two instrumentations of one call'); or ttft_emit.otel.time_first_chunk(client) "
    "on the model's client, which times LangChain's LLM span",
    "io.opentelemetry.openai-java-1.1": "OpenTelemetry's Java instrumentation of openai-java tells no first "
    "chunk, nor whether the call streamed: mark the caller's first token (a plain call's answer too) with a "
    "zero-length child span ttft.stage = first_token; the chat span's llm_ttft then runs to the mark "
    "(docs/otlp-mapping.md, 'The caller's first token, marked')",
    "org.springframework.boot": "Spring AI's chat spans (Micrometer's observations, through Spring Boot's "
    "OpenTelemetry bridge) tell no first chunk: mark the caller's first token with a zero-length child span "
    "ttft.stage = first_token when the first text of the Flux arrives, its parent the request's Context taken "
    "before the stream (the Flux runs on Reactor's threads); the chat span's llm_ttft then runs to the mark. "
    "Set spring.reactor.context-propagation=auto, or a stream's spans leave the request's trace "
    "(docs/otlp-mapping.md, 'The caller's first token, marked')",
    **dict.fromkeys(
        ("openinference.instrumentation.anthropic", "opentelemetry.instrumentation.anthropic"),
        "this Anthropic instrumentation tells no first chunk: the anthropic SDK's own tracing does (on when a "
        "global tracer provider is set, or anthropic.Anthropic(open_telemetry={'tracer_provider': provider})); its "
        "span inside this one is counted once. Or ttft_emit.otel.time_first_chunk(client) (docs/otlp-mapping.md)",
    ),
    **dict.fromkeys(
        ("openinference.instrumentation.google_genai", "opentelemetry.instrumentation.google_generativeai"),
        "this Google Gen AI instrumentation tells no first chunk: ttft_emit.otel.time_first_chunk(client) on the "
        "google.genai.Client does, or OpenTelemetry's own opentelemetry-instrumentation-google-genai "
        "(google-genai < 3) tells it (docs/otlp-mapping.md)",
    ),
    **dict.fromkeys(
        (
            "openinference.instrumentation.bedrock",
            "opentelemetry.instrumentation.botocore.bedrock-runtime",
            "opentelemetry.instrumentation.bedrock",
        ),
        "this Bedrock instrumentation tells no first chunk: ttft_emit.otel.time_first_chunk(client) on the boto3 "
        "bedrock-runtime client does (converse_stream, invoke_model_with_response_stream; docs/otlp-mapping.md)",
    ),
    **dict.fromkeys(
        ("openinference.instrumentation.litellm", "opentelemetry.instrumentation.litellm", "litellm"),
        "LiteLLM's spans tell no first chunk: ttft_emit.otel.time_first_chunk(litellm) on the module does (before "
        "code imports completion by name). With LiteLLM's own otel callback, add fill_missing=True: its span is "
        "written after the call (docs/otlp-mapping.md)",
    ),
    **dict.fromkeys(
        (
            "@arizeai/openinference-instrumentation-openai",
            "@traceloop/instrumentation-openai",
            "@opentelemetry/instrumentation-openai",
        ),
        "this JavaScript instrumentation of the openai client tells no first chunk: ttft-emit-otel (npm install "
        "./emitter/js) does, with FirstChunkTiming's spanProcessor() in the provider's spanProcessors and "
        "timing.instrument(client) (fillMissing for @traceloop's Responses stream); it sets "
        "gen_ai.response.time_to_first_chunk and gen_ai.request.stream on the LLM span (docs/otlp-mapping.md)",
    ),
    **dict.fromkeys(
        ("openinference.instrumentation.openai_agents", "opentelemetry.instrumentation.openai_agents"),
        "the OpenAI Agents SDK's spans tell no first chunk, nor whether the call streamed: call "
        "ttft_emit.otel.time_first_chunk(client) on the AsyncOpenAI client given to set_default_openai_client (or "
        "to the agent's model); it times the streams the SDK reads through with_streaming_response and sets the "
        "first chunk on the agents span (docs/otlp-mapping.md)",
    ),
    "gcp.vertex.agent": "Google ADK's spans tell no first chunk, nor whether the call streamed: "
    "ttft_emit.otel.time_first_chunk(litellm) for a LiteLlm model (before ADK's first model call: ADK copies "
    "litellm.acompletion then), or time_first_chunk(client) on its google.genai.Client; it sets both on ADK's "
    "generate_content span (docs/otlp-mapping.md)",
    "semantic_kernel.utils.telemetry.model_diagnostics.decorators": "Semantic Kernel's chat spans tell no first "
    "chunk, nor whether the call streamed: ttft_emit.otel.time_first_chunk(async_client) on the AsyncOpenAI "
    "client given to OpenAIChatCompletion sets both on SK's span (docs/otlp-mapping.md)",
    "opentelemetry.instrumentation.haystack": "OpenLLMetry's Haystack spans tell no first chunk: instrument the "
    "OpenAI client too (its OpenAIInstrumentor), or ttft_emit.otel.time_first_chunk(generator.client) after "
    "warm_up() (docs/otlp-mapping.md)",
    "openinference.instrumentation.haystack": "OpenInference's Haystack spans tell no first chunk: add its "
    "OpenAIInstrumentor (the client's span inside counts), or ttft_emit.otel.time_first_chunk(generator.client) "
    "after warm_up() (docs/otlp-mapping.md)",
    "opentelemetry.instrumentation.langchain": "OpenLLMetry's LangChain spans tell no first chunk, and its OpenAI "
    "instrumentation's span is suppressed under them: call ttft_emit.otel.time_first_chunk(llm.root_client) once "
    "per ChatOpenAI; it sets the first chunk on the ChatOpenAI.chat span (docs/otlp-mapping.md, 'The helper')",
}


@dataclass(slots=True)
class TraceFinding:
    """One trace: its scope, the status it would be stored with (``not stored`` when every stage span was
    dead-lettered), the source of each stage and of the tenant, and what is missing (keys of :data:`FIXES`,
    or a dead letter's reason and detail)."""

    trace_id: str
    scope: tuple[str, str]
    status: str
    stages: dict[str, str] = field(default_factory=dict)
    tenant: str = ""
    missing: list[str] = field(default_factory=list)
    #: Stage spans counted once with another that holds them or that they hold (:mod:`streams.core.otlp_nesting`).
    nested: list[str] = field(default_factory=list)
    #: LLM calls taken as steps before the answer (a tool call, a question rewritten before the retrieval).
    steps: int = 0


@dataclass(slots=True)
class ScopeReport:
    """The traces of one instrumentation scope, counted."""

    scope: tuple[str, str]
    traces: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    stages: dict[str, Counter[str]] = field(default_factory=dict)
    tenant: Counter[str] = field(default_factory=Counter)
    missing: Counter[str] = field(default_factory=Counter)
    nested: Counter[str] = field(default_factory=Counter)
    #: LLM calls taken as steps before the answer, and the traces that had any.
    steps: int = 0
    traces_with_steps: int = 0
    #: Up to :data:`EXAMPLES` trace ids per missing item (for ``ttft request <trace id>``).
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def complete(self) -> int:
        return self.statuses["complete"]

    def add(self, finding: TraceFinding) -> None:
        self.traces += 1
        self.statuses[finding.status] += 1
        for stage, source in finding.stages.items():
            self.stages.setdefault(stage, Counter())[source] += 1
        self.tenant[finding.tenant or "(none)"] += 1
        self.missing.update(dict.fromkeys(finding.missing, 1))
        self.nested.update(finding.nested)
        self.steps += finding.steps
        self.traces_with_steps += finding.steps > 0
        for what in finding.missing:
            ids = self.examples.setdefault(what, [])
            if len(ids) < EXAMPLES:
                ids.append(finding.trace_id)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: counts per status, stage source, tenant source and missing item (with its fix)."""
        return {
            "scope": self.scope[0],
            "scope_version": self.scope[1],
            "traces": self.traces,
            "complete": self.complete,
            "statuses": dict(sorted(self.statuses.items())),
            "stages": {stage: dict(c.most_common()) for stage, c in self.stages.items()},
            "tenant": dict(self.tenant.most_common()),
            "counted_once": dict(self.nested.most_common()),
            "llm_steps": {"calls": self.steps, "traces": self.traces_with_steps},
            "missing": [
                {"what": what, "traces": n, "fix": fix_for(what, self.scope[0]), "examples": self.examples[what]}
                for what, n in self.missing.most_common()
            ],
        }


def fix_for(what: str, scope: str = "") -> str:
    """The one-line fix of a missing item for the LLM spans of ``scope`` (a dead letter's detail is its own
    explanation)."""
    if what == "first chunk" and scope in FIRST_CHUNK_FIXES_BY_SCOPE:
        return FIRST_CHUNK_FIXES_BY_SCOPE[scope]
    if what in FIXES:
        return FIXES[what]
    if what.startswith("dead letter"):
        return "see the detail: the span breaks the stage-event contract"
    if what.startswith("first chunk ignored"):
        if any(reason in what for reason in FIRST_CHUNK_HIDDEN_BY_SCOPE.values()):
            return FIXES["first token shown later"]
        marks_no_token = (*EVENTS_MARK_NO_TOKEN.values(), *ATTRS_MARK_NO_TOKEN.values(), AZURE_FILTER_CHUNK)
        if any(reason in what for reason in marks_no_token):
            return FIXES["first chunk"]
        return "the first-chunk value must be a finite number within the span (seconds after its start)"
    return f"a span with ttft.stage = {what}"


def check_traces(
    spans: Iterable[OtlpSpan], join: JoinConfig | None = None, caps: CapsConfig | None = None
) -> tuple[list[ScopeReport], list[TraceFinding]]:
    """Every trace of ``spans`` through the mapping and a join: the reports per scope (most traces first) and
    the finding per trace (in the order the traces were first seen)."""
    join = join or JoinConfig()
    caps = caps or CapsConfig()
    traces: dict[str, list[OtlpSpan]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    findings = [_check_trace(trace_id, trace, join, caps) for trace_id, trace in traces.items()]
    reports: dict[tuple[str, str], ScopeReport] = {}
    for finding in findings:
        reports.setdefault(finding.scope, ScopeReport(finding.scope)).add(finding)
    return sorted(reports.values(), key=lambda r: (-r.traces, r.scope)), findings


def _check_trace(trace_id: str, spans: list[OtlpSpan], join: JoinConfig, caps: CapsConfig) -> TraceFinding:
    asm = TraceAssembler(OtlpConfig(), join, caps, _TOPIC)
    # The exporter's order (end time, the root last), so the trace resolves as it would live.
    ordered = sorted(spans, key=lambda s: (s.is_root, s.end_ns, s.span_id))
    now = max(s.end_ns for s in spans) / _NS_PER_MS + 1.0
    outputs = asm.add_message(ordered, 0, 0, now)
    outputs += asm.advance(0, now)
    later = now + join.request_timeout_ms + join.grace_ms + join.idle_tick_ms
    outputs += asm.advance(0, later)
    notes = {s.span_id: (s, note_span(s, 0)) for s in spans}
    parents = {s.span_id: s.parent_span_id for s in spans}
    callers = {i: n.caller_stream for i, (_, n) in notes.items() if n.caller_stream is not None}
    if callers:  # as the assembler does: an LLM span that does not say takes its caller's stream flag
        context = TraceContext(trace_id, {}, None, False, frozenset(), parents, callers=callers)
        context.tell_streaming(n for _, n in notes.values())
    roots = [n for s, n in notes.values() if s.is_root]
    linked = any(parents.values())
    lone = starts_at_stage(roots[0] if len(roots) == 1 else None, [n for _, n in notes.values()], linked)
    staged = [(n.stage, n) for _, n in notes.values() if n.stage is not None and n.stage not in (EMBEDDING, TOOL_CALL)]
    nested = nested_duplicates(staged, parents)
    llms = [n for _, n in notes.values() if n.stage == "llm_ttft" and n.span_id not in nested]
    # Calls before the answer (tool calls, rewrites), decided as the assembler does: the answering call tells it.
    steps = agent_steps([n for _, n in notes.values() if n.span_id not in nested])
    answering = [n for n in llms if n.span_id not in steps]
    first_llm = min(answering, key=lambda n: (n.start_ns, n.span_id)) if answering else None
    scope = NO_LLM_SCOPE if first_llm is None else (first_llm.scope_name, first_llm.scope_version)
    finding = TraceFinding(trace_id, scope, "not stored", tenant=_tenant_source(spans), steps=len(steps))
    finding.nested = [_nested_item(notes[span_id], staged, notes, nested, parents) for span_id in sorted(nested)]
    requests = RequestJoin(join, _WINDOW_MS)
    for output in outputs:
        if isinstance(output, DeadLetter):
            finding.missing.append(_dead_letter_item(output))
            continue
        assert isinstance(output, ForwardedEvent)
        event = orjson.loads(output.value)
        finding.stages.setdefault(event["stage"], _stage_source(event, notes))
        decoded = decode_stage_event(output.value, output.request_id.encode(), _TOPIC, 0, 0, None, caps, later)
        if not isinstance(decoded, DeadLetter):
            requests.add(decoded, 0, later)
    requests.advance(0, later)
    records = requests.advance(0, later + join.request_timeout_ms + join.forget_after_ms)
    if records:
        record = max(records, key=lambda r: r["record_version"])
        finding.status = record["status"]
        finding.missing += _record_gaps(record, first_llm)
    elif not outputs and not staged:
        finding.status = NOT_A_REQUEST
        finding.missing[:0] = [LONE_SPAN] if lone else []
        return finding
    if lone:  # the cause of whatever else is missing: first
        finding.missing.insert(0, LONE_SPAN)
    if not finding.tenant and "tenant" not in finding.missing:
        finding.missing.append("tenant")
    if first_llm is None and any(borrowed(span) or span.scope_name == "litellm" for span in spans):
        finding.missing.append(BORROWED_CALL)
    if first_llm is not None and first_llm.first_chunk_problem:
        finding.missing.append(f"first chunk ignored: {first_llm.first_chunk_problem}")
    held = [n for _, n in notes.values()]
    hidden = hidden_first_chunk(held, any(n.stage == "first_token" for n in held))
    if hidden and first_llm is not None and first_llm.streaming:  # its own fix, not the helper's
        finding.missing = [m for m in finding.missing if m != "first chunk"] + [f"first chunk ignored: {hidden}"]
    if first_llm is not None and first_llm.streaming is None and "first chunk" in finding.missing:
        finding.missing.append("stream flag")
    if (
        first_llm is not None
        and first_llm.streaming is not False
        and first_llm.first_chunk_source == HEADERS_FIRST_CHUNK
        and first_llm.scope_name.startswith("openlit")
    ):
        finding.missing.append("first chunk from the response headers")
    if "first chunk" in finding.missing and any(
        n.stage == "llm_ttft" and is_azure_openai(span.attributes) for span, n in notes.values()
    ):  # another instrumentor would not help: theirs count Azure's filter chunk
        finding.missing = [AZURE_FIRST_CHUNK if m == "first chunk" else m for m in finding.missing]
    finding.missing = list(dict.fromkeys(finding.missing))  # one per trace: every stage span lacks the tenant
    finding.stages = dict(sorted(finding.stages.items(), key=lambda item: _stage_order(item[0])))
    return finding


def _nested_item(
    found: tuple[OtlpSpan, SpanNote],
    staged: list[tuple[str, SpanNote]],
    notes: dict[str, tuple[OtlpSpan, SpanNote]],
    nested: set[str],
    parents: dict[str, str],
) -> str:
    """How a stage span counted once is reported: its name and convention, and the span it holds or sits in."""
    span, note = found
    stage = note.stage or ""
    same = [n for s, n in staged if s == stage and n.span_id not in nested]
    same += [n for s, n in staged if s == stage and n.span_id in nested]  # a kept partner first
    what = f"{span.name!r} ({stage_and_source(span.attributes)[1]})"
    other = partner(note, same, parents)
    if other is None:
        return f"{what}: one {stage}, counted once"
    where, span_id = other.split(":", 1)
    return f"{what} {where} {notes[span_id][0].name!r}: one {stage}, counted once"


def _stage_order(stage: str) -> tuple[int, str]:
    return (KNOWN_STAGES.index(stage), "") if stage in KNOWN_STAGES else (len(KNOWN_STAGES), stage)


def _tenant_source(spans: list[OtlpSpan]) -> str:
    """The attribute that gives the trace its tenant (span or resource), as the mapping looks it up."""
    for name in CONTEXT_ATTRS["tenant_id"]:
        if any(isinstance(v := s.attributes.get(name), str) and v for s in spans):
            return name
    return ""


def _dead_letter_item(letter: DeadLetter) -> str:
    if letter.reason_code == "missing_tenant":
        return "tenant"
    if letter.detail.endswith(LOST_MARK_DETAIL):
        return "first-token mark without its request"
    return f"dead letter {letter.reason_code}: {letter.detail[:160]}"


def _stage_source(event: dict[str, Any], notes: dict[str, tuple[OtlpSpan, SpanNote]]) -> str:
    """Which attribute or event of which span gave ``event``."""
    stage, event_id = event["stage"], event.get("event_id", "")
    if stage == "prompt_assemble" and event_id.endswith("/prompt_assemble"):
        return "derived: from the last retrieval or rerank end to the LLM span's start"
    found = notes.get(event_id)
    if found is None:
        return "?"
    span, note = found
    named = stage_and_source(span.attributes)[1]
    if stage == "request_start":
        if span.is_root and borrowed(span):
            return "the root span (LiteLLM's callback wrote its call onto it: not an LLM span)"
        return "the root span" if span.is_root and not named else named
    if stage in ("llm_ttft", "first_token") and note.stage == "llm_ttft":
        if stage == "llm_ttft" and (event.get("attrs") or {}).get("first_chunk_from") == "first_token":
            chunk = "the service's first-token mark (ttft.stage = first_token) inside it: the span tells none"
        elif note.first_chunk_ns is None:
            chunk = "the span's end (not streaming)"
        elif note.first_chunk_source in _ATTR_SOURCES:
            chunk = f"attribute {note.first_chunk_source}"
        else:
            chunk = f"event {note.first_chunk_source!r}"
        own = note.first_chunk_source == OWN_FIRST_CHUNK_ATTR
        if note.first_chunk_ns is not None and not own and span.scope_name in AZURE_FILTER_CHUNK_SCOPES:
            chunk += ANY_CHUNK  # they mark a chunk with no output too
        return f"{named}, first chunk from {chunk}" if stage == "llm_ttft" else f"the LLM span's first chunk ({chunk})"
    if stage == LLM_UNMEASURED:
        told = "not told" if note.streaming is None else ("streaming" if note.streaming else "not streaming")
        return f"{named}, no first chunk (streaming: {told})"
    if stage == "vector_recall" and note.stage != "vector_recall":
        return f"{named} inside a retrieval span"
    return named


def _record_gaps(record: dict[str, Any], llm: SpanNote | None) -> list[str]:
    """What keeps the stored record from ``complete``, as keys of :data:`FIXES` (or stage names)."""
    gaps: list[str] = []
    if record["status"] == "orphan":
        gaps.append("request_start")
    unmeasured = record["status"] == "no_first_chunk" or record.get("llm_unmeasured_ms") is not None
    if unmeasured:
        gaps.append("first chunk")
    for stage in record["missing_stages"]:
        if unmeasured and stage in ("llm_ttft", "first_token"):
            continue
        if stage == "first_token" and llm is None:
            continue  # the LLM span's absence says it
        gaps.append(stage)
    return gaps
