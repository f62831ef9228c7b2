"""A LangGraph agent (``create_react_agent``, LangGraph 1.2) streamed with ``stream_mode="messages"`` under
OpenInference (± ttft-emit's helper) and OpenLLMetry with the helper, against a stub that answers with a tool call
first (tests/data/otel_instrumentations/capture_langgraph.py: how, and with which versions).

The caller gets turn 1's tool-call chunk ~320 ms before the answer's first text: that turn is a step, and the stored
TTFT is the answering turn's first chunk. OpenInference's LangChain span says ``"stream": false`` in this mode (the
request streamed); the client's span inside it counts.
"""

from __future__ import annotations

import pytest

from tests.support.captured_otlp import captured, stored_record

SETUPS = ("langgraph_openinference", "langgraph_openinference_helper", "langgraph_openllmetry_helper")
TOLERANCE_MS = 1.5
TOOL_MS = 30.0


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("case", ["tool_stream", "plain_stream"])
def test_the_answering_turns_first_chunk_is_the_ttft(setup: str, case: str) -> None:
    truth, spans = captured(setup)[case]
    record, _ = stored_record(spans)
    (root,) = [s for s in spans if s.is_root]
    client_ms = (truth["first_chunk_ns"] - root.start_ns) / 1e6
    assert record["status"] == "complete"
    assert client_ms - TOLERANCE_MS <= record["ttft_ms"] <= client_ms + TOLERANCE_MS
    tool = case == "tool_stream"
    assert record["stage_repeats"] == ({"llm_ttft": 1} if tool else {})
    assert record["ttft_ms"] > (truth["first_any_chunk_ns"] - root.start_ns) / 1e6 + (250.0 if tool else -1.0)
    # Between the turns: the tool's 30 ms and LangGraph's own steps.
    assert (TOOL_MS if tool else 0.0) - TOLERANCE_MS <= record["other_ms"] <= (TOOL_MS + 20.0 if tool else 1.0)
