"""A Haystack RAG pipeline (haystack-ai 3.4: BM25 retriever, prompt builder, OpenAI chat generator), traced by
OpenInference's Haystack and OpenAI instrumentors or by Haystack's own tracing (``opentelemetry-haystack``), captured
against the loopback stub (tests/data/otel_instrumentations/capture_haystack.py: how, and with which versions).

Three things were read wrong before:

* Haystack's own tracing names every component ``haystack.component.run`` and tells it by its class in
  ``haystack.component.type``: no span was a stage, so no request was stored at all (``native``), or one without its
  retrieval and prompt, ``missing_stage`` (``native_openai``, ``native_helper``);
* OpenInference gives Haystack's (non-chat) ``PromptBuilder`` the span kind ``LLM``: it was an LLM call of 0.2-2.2 ms
  without a first chunk;
* OpenInference's span proxy holds ``openinference.span.kind`` until the span ends, so ttft-emit's helper saw no LLM
  span to time under the Haystack instrumentor alone (``openinference_haystack_only_helper``: ``no_first_chunk``).
"""

from __future__ import annotations

import pytest

from streams.core.otlp_check import check_traces
from tests.support.captured_otlp import captured, span_ms, stored_record

DONE, UNTIMED = "complete", "no_first_chunk"
CASES = ("stream", "non_stream", "stream_warm")
#: set-up -> the status of each of its requests.
EXPECTED: dict[str, str] = {
    "openinference": DONE,
    "openinference_helper": DONE,
    # Nothing on the generator's span tells its first chunk, or whether it streamed.
    "openinference_haystack_only": UNTIMED,
    "openinference_haystack_only_helper": DONE,
    "openinference_haystack_only_fill": DONE,
    "openinference_promptbuilder": DONE,
    # Haystack's own spans tell no first chunk: retrieval and prompt stored, the generator llm_unmeasured.
    "native": UNTIMED,
    "native_openai": DONE,
    "native_helper": DONE,
}
TOLERANCE_MS = 1.5
#: A plain call's reply reaches the caller after Haystack converted it, after the client's span ended: 1-4.1 ms.
PLAIN_SLACK_MS = 5.0


@pytest.mark.parametrize("setup", EXPECTED)
@pytest.mark.parametrize("case", CASES)
def test_every_request_is_stored_with_its_retrieval_prompt_and_ttft(setup: str, case: str) -> None:
    truth, spans = captured(f"haystack_{setup}")[case]
    record, _ = stored_record(spans)
    assert record["status"] == EXPECTED[setup]
    assert record["retrieval_ms"] is not None and record["prompt_assemble_ms"] is not None
    if record["status"] != DONE:
        assert record["ttft_ms"] is None and record["llm_unmeasured_ms"] is not None
        return
    (root,) = [s for s in spans if s.is_root]
    seen = truth["first_chunk_ns"] if truth["streaming"] else truth["answered_ns"]
    client_ms = (seen - root.start_ns) / 1e6
    slack = 0.0 if truth["streaming"] else PLAIN_SLACK_MS
    assert client_ms - slack - TOLERANCE_MS <= record["ttft_ms"] <= client_ms + TOLERANCE_MS
    assert record["llm_unmeasured_ms"] is None and record["other_ms"] >= -TOLERANCE_MS


@pytest.mark.parametrize("setup", ["native", "native_openai", "native_helper"])
def test_haystacks_own_spans_are_told_by_their_component_type(setup: str) -> None:
    _, spans = captured(f"haystack_{setup}")["stream_warm"]
    record, _ = stored_record(spans)
    components = {s.attributes.get("haystack.component.type"): s for s in spans if s.name == "haystack.component.run"}
    retriever, builder = components["InMemoryBM25Retriever"], components["ChatPromptBuilder"]
    assert record["retrieval_ms"] == pytest.approx((retriever.end_ns - retriever.start_ns) / 1e6)
    assert record["prompt_assemble_ms"] == pytest.approx((builder.end_ns - builder.start_ns) / 1e6)


def test_openinferences_prompt_builder_llm_span_is_the_prompt() -> None:
    _, spans = captured("haystack_openinference_promptbuilder")["stream_warm"]
    record, _ = stored_record(spans)
    assert record["prompt_assemble_ms"] == pytest.approx(span_ms(spans, "PromptBuilder.run"))
    assert record["stage_repeats"] == {}  # one LLM call: the client's (the generator's span holds it)


@pytest.mark.parametrize("setup", [s for s, status in EXPECTED.items() if status == DONE])
def test_otel_check_finds_every_request_complete(setup: str) -> None:
    spans = [s for _, trace in captured(f"haystack_{setup}").values() for s in trace]
    reports, findings = check_traces(spans)
    assert [f.status for f in findings] == [DONE] * len(CASES)
    assert not any(r.missing for r in reports)
