"""Azure OpenAI through frameworks, with its prompt filter chunk and a role-only chunk 120 ms before the first content:
LiteLLM (``azure/…``) and LangChain (``AzureChatOpenAI``) under OpenInference and OpenLLMetry, ± their OpenAI
instrumentors, ± ttft-emit's helper (tests/data/otel_instrumentations/capture_azure_frameworks.py); the ``openai``
Node client's ``AzureOpenAI`` under OpenInference's, Traceloop's and OpenTelemetry's instrumentations ± the Node
helper, and the Vercel AI SDK's ``@ai-sdk/azure`` with ``ai`` 6 and 5 (azure_node/capture.mjs). Each client's
requests go to the loopback stub; the versions are in the captures' json.

Nothing is stored early but one: the only instrumentation that marks a first chunk is OpenInference's OpenAI one, at
the filter chunk, ignored on Azure (test_otlp_prefill_chunks.py); the helpers are exact. The exception, kept visible:
the Vercel AI SDK 5 (``ai`` 5.0) takes the role-only chunk's empty text delta for the first chunk (``ai`` 6 holds the
stream to the first output: exact), and nothing on its spans tells the two versions apart; the caller's first text
marked (emitter/js's ``firstTokenMarked`` around ``textStream``) gives it back exact. The helper's own gaps:
OpenLLMetry's OpenAI span under LiteLLM's Azure path ends with the response headers (``with_raw_response``): exact
with ``fill_missing=True`` only. OpenInference's LangChain span names its kind only when it ends: the helper matched
nothing under it alone until it learnt to take the newest such span (exact since).
"""

from __future__ import annotations

import pytest

from streams.core.otlp_check import AZURE_FIRST_CHUNK, check_traces
from tests.support.captured_otlp import captured, stored_record

DONE, UNTIMED = "complete", "no_first_chunk"
PY = ("stream", "non_stream", "stream_2")
NODE = ("stream", "non_stream", "stream2")


def _plain_only(cases: tuple[str, ...]) -> dict[str, str]:
    return {c: DONE if c == "non_stream" else UNTIMED for c in cases}


#: set-up -> case -> the status it must be stored with.
EXPECTED: dict[str, dict[str, str]] = {
    **{
        f"azure_{s}": _plain_only(PY)
        for s in (
            "litellm_openinference",
            "litellm_openinference_openai",
            "litellm_openllmetry_openai",
            "litellm_openllmetry_openai_helper",  # the client's span ends with the headers: nothing to time
            "litellm_openllmetry_litellm_openai",
            "langchain_openinference",
            "langchain_openinference_openai",
        )
    },
    **{
        f"azure_{s}": dict.fromkeys(PY, DONE)
        for s in (
            "litellm_openinference_helper",
            "litellm_openinference_openai_helper",
            "litellm_openllmetry_litellm_openai_helper",
            "langchain_openinference_openai_helper",
            "langchain_openinference_helper",  # LangChain's span, named LLM only at its end: the helper takes it
            "langchain_openllmetry_helper",
            "langchain_openllmetry_openai_helper",
            "litellm_openllmetry_openai_fill",  # the helper's own span (fill_missing) holds the ended one
        )
    },
    # OpenLLMetry's LangChain span tells no stream flag: a plain call is untimed too
    "azure_langchain_openllmetry": dict.fromkeys(PY, UNTIMED),
    "azure_langchain_openllmetry_openai": dict.fromkeys(PY, UNTIMED),
    "azure_node_vercel": dict.fromkeys(NODE, DONE),
    # the Vercel AI SDK 5 with the caller's textStream in emitter/js's firstTokenMarked: the mark gives the TTFT
    "azure_node_vercel_ai5_marked": dict.fromkeys(NODE, DONE),
    "azure_node_openinference": _plain_only(NODE),
    "azure_node_openllmetry": dict.fromkeys(NODE, UNTIMED),
    "azure_node_otel": dict.fromkeys(NODE, UNTIMED),
    **{f"azure_node_{lib}_helper": dict.fromkeys(NODE, DONE) for lib in ("openinference", "openllmetry", "otel")},
}
#: Stored TTFT against the caller's first content chunk (a plain call: its answer), ms: the Vercel AI SDK marks its
#: first chunk ~2 ms before the caller's text; plain answers reach the caller up to 2.2 ms after the span's end.
TOLERANCE_MS = {"azure_node_vercel": 2.5}
STREAM_MS, PLAIN_MS = 1.0, 2.5


def _stored_and_seen(setup: str, case: str) -> tuple[dict[str, object], float]:
    truth, spans = captured(setup)[case]
    record, _ = stored_record(spans)
    (root,) = [s for s in spans if s.is_root]
    seen = truth["first_chunk_ns"] if truth["streaming"] else truth["answered_ns"]
    return record, (seen - root.start_ns) / 1e6


@pytest.mark.parametrize(("setup", "case"), [(s, c) for s, cases in EXPECTED.items() for c in cases])
def test_stored_status_and_ttft(setup: str, case: str) -> None:
    record, seen_ms = _stored_and_seen(setup, case)
    assert record["status"] == EXPECTED[setup][case]
    if record["status"] != DONE:
        assert record["ttft_ms"] is None
        return
    streaming = case != "non_stream"
    tolerance = TOLERANCE_MS.get(setup, STREAM_MS if streaming else PLAIN_MS)
    assert record["ttft_ms"] == pytest.approx(seen_ms, abs=tolerance)


def test_the_vercel_ai_sdk_5_takes_the_role_only_chunk_for_the_first_one() -> None:
    """The limit: ``ai`` 5.0's ``msToFirstChunk`` at the role-only chunk, 120 ms before the text; ``complete``."""
    for case in ("stream", "stream2"):
        record, seen_ms = _stored_and_seen("azure_node_vercel_ai5", case)
        assert record["status"] == DONE
        assert 100.0 < seen_ms - float(record["ttft_ms"]) < 140.0  # type: ignore[arg-type]


@pytest.mark.parametrize("setup", ["azure_langchain_openinference", "azure_litellm_openinference"])
def test_the_check_names_the_helper_for_azure_not_another_instrumentor(setup: str) -> None:
    _, spans = captured(setup)["stream"]
    reports, _ = check_traces(spans)
    missing = {m["what"]: m["fix"] for r in reports for m in r.to_json()["missing"]}
    assert "first chunk" not in missing
    assert "time_first_chunk(client)" in missing[AZURE_FIRST_CHUNK]
