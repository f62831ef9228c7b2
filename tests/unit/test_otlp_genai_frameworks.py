"""Agent frameworks with their own OpenTelemetry tracing on the GenAI conventions, against the loopback stub
(tests/data/otel_instrumentations/capture_genai_frameworks.py: how, and with which versions): Google ADK 2.13 (its
``generate_content <model>`` spans, over LiteLLM; its legacy schema's ``call_llm``) and Semantic Kernel 1.45 (its
``chat <model>`` spans).

Neither says whether a call streamed or when its first chunk came: a stream's span and a plain call's carry the same
attributes, so every request is ``no_first_chunk`` (reading a missing flag as a plain call would store a stream's
whole duration as its TTFT). ttft-emit's helper makes both exact. Under Semantic Kernel it broke every streamed call
before: SK checks ``isinstance(response, openai.AsyncStream)``, and the helper's stream wrapper was none (it now
answers with the wrapped stream's class, as wrapt's proxies do). A tool's ``execute_tool`` span between two turns
makes the first a step (ADK says ``stop`` on a tool-call turn; SK says ``FinishReason.TOOL_CALLS``).
"""

from __future__ import annotations

import pytest

from streams.core.otlp_conventions import asked_for_tools
from tests.support.captured_otlp import captured, stored_record

CASES = ("stream", "non_stream", "tool_stream")
#: set-up -> the status of each of its requests.
EXPECTED = {
    "adk": "no_first_chunk",
    "adk_legacy": "no_first_chunk",
    "sk": "no_first_chunk",
    "adk_helper": "complete",
    "sk_helper": "complete",
}
TOLERANCE_MS = 1.5
#: ADK hands the caller its event after its own work on the chunk: 0.1-1.6 ms here.
SLACK_MS = {"adk_helper": 2.5}
TOOL_MS = 30.0


@pytest.mark.parametrize("setup", EXPECTED)
@pytest.mark.parametrize("case", CASES)
def test_stored_status_and_ttft_are_what_the_caller_saw(setup: str, case: str) -> None:
    truth, spans = captured(f"genai_{setup}")[case]
    assert "error" not in truth  # the service's call went through (under the helper too)
    record, _ = stored_record(spans)
    assert record["status"] == EXPECTED[setup]
    if record["status"] != "complete":
        assert record["ttft_ms"] is None and record["llm_unmeasured_ms"] is not None
        # turn 1 of a tool loop is a step, measured whole even when the answering turn is not
        assert (record["llm_ttft_ms"] is not None) is (case == "tool_stream")
        return
    if case == "tool_stream":  # turn 1 a step, summed with turn 2's time to its first chunk
        assert record["stage_repeats"] == {"llm_ttft": 1}
    (root,) = [s for s in spans if s.is_root]
    seen = truth["first_chunk_ns"] if truth["streaming"] else truth["answered_ns"]
    client_ms = (seen - root.start_ns) / 1e6
    slack = SLACK_MS.get(setup, 0.0)
    assert client_ms - slack - TOLERANCE_MS <= record["ttft_ms"] <= client_ms + TOLERANCE_MS
    tool = TOOL_MS if case == "tool_stream" else 0.0
    assert tool - TOLERANCE_MS <= record["other_ms"] <= tool + 15.0


def test_semantic_kernels_tool_call_turn_says_so_in_its_own_finish_reason() -> None:
    _, spans = captured("genai_sk")["tool_stream"]
    turns = sorted((s for s in spans if s.name.startswith("chat ")), key=lambda s: s.start_ns)
    assert [asked_for_tools(s.attributes) for s in turns] == [True, False]
