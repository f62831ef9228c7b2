"""OpenLIT's own spans (``openlit.init``, openlit 1.45.0 with openai 2.54), captured against the stub by
tests/data/otel_instrumentations/capture_openlit.py: the LLM span ``chat <model>`` carries
``gen_ai.server.time_to_first_token``. On a streaming call OpenLIT starts that clock when ``create()`` returned
(the response headers came), not at its span's start: the stored ``llm_ttft`` and TTFT are short by the request's
round trip, and ``ttft otel check`` says so."""

from __future__ import annotations

import pytest

from streams.core.otlp_check import check_traces
from tests.support.captured_otlp import Capture, captured, span_ms, stored_record

STUB_FIRST_CHUNK_MS = 120.0


@pytest.fixture(scope="module")
def traces() -> Capture:
    return captured("openlit")


@pytest.mark.parametrize("case", ["stream", "stream2"])
def test_streaming_is_complete_but_short_by_the_round_trip_to_the_headers(traces: Capture, case: str) -> None:
    truth, spans = traces[case]
    record, _ = stored_record(spans)
    (llm,) = [s for s in spans if s.name.startswith("chat ")]
    assert record["status"] == "complete" and 0.0 <= record["other_ms"] < 1.0
    assert record["llm_ttft_ms"] == pytest.approx(llm.attributes["gen_ai.server.time_to_first_token"] * 1e3)
    client_ttft = (truth["first_chunk_ns"] - truth["started_ns"]) / 1e6
    short = client_ttft - record["ttft_ms"]
    assert 1.0 < short < 50.0, short  # what the span cannot tell: request sent, headers back
    assert (record["prompt_tokens"], record["cached_tokens"]) == (812, 512)


def test_a_plain_call_is_its_whole_duration(traces: Capture) -> None:
    _, spans = traces["non_stream"]
    record, _ = stored_record(spans)
    (llm,) = [s for s in spans if s.name.startswith("chat ")]
    assert record["status"] == "complete"
    assert record["llm_ttft_ms"] == pytest.approx(span_ms(spans, llm.name), abs=1.0)


def test_otel_check_says_the_first_chunk_counts_from_the_headers(traces: Capture) -> None:
    spans = [s for _, trace in traces.values() for s in trace]
    (report,), findings = check_traces(spans)
    assert [f.status for f in findings] == ["complete"] * 3
    assert report.missing["first chunk from the response headers"] == 2  # the streaming calls
