"""A LangChain RAG service under real framework instrumentations, unmodified, through the real Collector to the
store: OpenInference's LangChain and OpenAI instrumentors together (Phoenix's set-up), and OpenLLMetry's, with
and without ttft-emit's helper (``tests/support/framework_rag.py``, in the venv of
``tests/data/otel_instrumentations/requirements-langchain.txt``).

What the store must say, against what the service's own spans say (read here by name):

- OpenInference: every request ``complete``, ``llm_ttft_ms`` and ``ttft_ms`` within 1 ms of the client's
  ``ChatCompletion`` span (its start to its first-chunk event, or to its end for a plain call), ``retrieval_ms``
  the ``EnsembleRetriever`` span's (its two retrievers and LangChain's ``ChatOpenAI`` span around the client's
  counted once), no ``llm_unmeasured_ms``, ``other_ms`` not negative;
- OpenLLMetry with the helper: every request ``complete``, exact to the first chunk the helper set on the
  ``ChatOpenAI.chat`` span; its ``vector_db_retrieve`` retrievers give ``retrieval_ms`` and the embeddings inside
  them ``vector_recall_ms``;
- OpenLLMetry without it: every request ``no_first_chunk`` (its span tells neither a first chunk nor whether the
  call streamed), with its retrieval and the call's whole duration in ``llm_unmeasured_ms``.

The services embed their documents at start-up: traces with no stage span, which must store nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streams.otel.instrumentations import instrumentation_python
from streams.settings import Settings
from tests.fixtures.otel import OtelCollectorHandle
from tests.integration.test_otel_acceptance import _drained, _env, _rows, _start, _wait_for_spans
from tests.support.instrumented_services import run_services
from tests.support.pipeline import REPO, Pipeline

pytestmark = [pytest.mark.otel, pytest.mark.kafka, pytest.mark.e2e, pytest.mark.timeout(600)]

REQUIREMENTS = REPO / "tests" / "data" / "otel_instrumentations" / "requirements-langchain.txt"
RUNNER = REPO / "tests" / "support" / "framework_rag.py"
#: Service -> (library, ttft-emit's helper); its tenant is ``lc-<service>``.
SERVICES = {
    "openinference": ("openinference", False),
    "openllmetry": ("openllmetry", True),
    "openllmetry_plain": ("openllmetry", False),
}
REQUESTS = 16
FIRST_CHUNK_DELAY_MS = 120.0
TOLERANCE_MS = 1.0
HELPER_ATTR = "gen_ai.response.time_to_first_chunk"


@pytest.fixture(scope="session")
def langchain_python() -> Path:
    """The LangChain venv's python (built once under .cache/, keyed by the requirements' hash)."""
    return instrumentation_python(REQUIREMENTS, timeout_s=900.0)


def _named(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (span,) = [s for s in spans if s["name"] == name]
    return span


def _span_truth(library: str, helped: bool, request: dict[str, Any]) -> dict[str, float]:
    """What the service's own spans say, in ms: the measured LLM span's start to its first chunk (its end for a
    plain call), the root's start to that chunk, and the outermost retrieval span's duration."""
    spans = request["spans"]
    (root,) = [s for s in spans if not s["parent"]]
    if library == "openinference":
        llm, retrieval = _named(spans, "ChatCompletion"), _named(spans, "EnsembleRetriever")
        events = [t for name, t in llm["events"] if name == "First Token Stream Event"]
        first = min(events) if request["streaming"] else llm["end_ns"]
    else:
        llm, retrieval = _named(spans, "ChatOpenAI.chat"), _named(spans, "vector_db_retrieve EnsembleRetriever")
        told = llm["attributes"].get(HELPER_ATTR)
        first = llm["start_ns"] + round(told * 1e9) if helped and request["streaming"] else llm["end_ns"]
    return {
        "llm_ttft_ms": (first - llm["start_ns"]) / 1e6,
        "ttft_ms": (first - root["start_ns"]) / 1e6,
        "retrieval_ms": (retrieval["end_ns"] - retrieval["start_ns"]) / 1e6,
        "llm_call_ms": (llm["end_ns"] - llm["start_ns"]) / 1e6,
    }


def test_langchain_under_real_instrumentations_through_the_collector(
    langchain_python: Path,
    otel_collector: OtelCollectorHandle,
    kafka_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    docs = run_services(
        langchain_python,
        RUNNER,
        SERVICES,
        otel_collector,
        tmp_path,
        tenant_prefix="lc-",
        requests=REQUESTS,
        timeout_s=180,
    )
    service_s = time.monotonic() - started
    for service, doc in docs.items():
        assert len(doc["requests"]) == REQUESTS, service
        named = {k for r in doc["requests"] for s in r["spans"] for k in (*s["attributes"], *s["resource"])}
        assert not [k for k in named if k.startswith("ttft.")], f"{service} spans carry ttft.* attributes"
    want = {(r["trace_id"], s["span_id"]) for d in docs.values() for r in d["requests"] for s in r["spans"]}
    messages = _wait_for_spans(otel_collector, want, timeout_s=60.0, extra_ok=True)

    (tmp_path / "home").mkdir()
    pipe = Pipeline(_env(kafka_settings, tmp_path / "home", otel_collector.topic), tmp_path / "home")
    try:
        join, writer = _start(pipe)
        pipe.wait_for(lambda: _drained(kafka_settings, join, otel_collector.topic), 120, "the pipeline to drain")
        nested = join.metric('ttft_otlp_spans_total{outcome="nested"}')
        for worker in (join, writer):
            assert pipe.stop(worker) == 0
    finally:
        pipe.stop_all()
    rows = _rows(pipe)
    assert pipe.query("SELECT reason_code FROM {db}.dead_letters FINAL") == []

    figures: dict[str, str] = {}
    for service, doc in docs.items():
        tenant, (library, helped) = f"lc-{service}", SERVICES[service]
        mine = {rid: row for (t, rid), row in rows.items() if t == tenant}
        # the start-up embeddings' traces (no stage span) are no requests
        assert set(mine) == {r["trace_id"] for r in doc["requests"]}, f"{service}: requests stored"
        statuses: Counter[str] = Counter()
        worst = 0.0
        for request in doc["requests"]:
            row, truth = mine[request["trace_id"]], _span_truth(library, helped, request)
            statuses[row["status"]] += 1
            assert row["retrieval_ms"] == pytest.approx(truth["retrieval_ms"], abs=1e-3), (service, row)
            if library == "openllmetry":
                assert row["vector_recall_ms"] is not None, row
            if library == "openllmetry" and not helped:  # its span says nothing of streaming: unmeasured
                assert row["status"] == "no_first_chunk", row
                assert row["llm_unmeasured_ms"] == pytest.approx(truth["llm_call_ms"], abs=1e-3)
                continue
            assert row["status"] == "complete" and row["llm_unmeasured_ms"] is None, (service, row)
            for column in ("llm_ttft_ms", "ttft_ms"):
                worst = max(worst, abs(row[column] - truth[column]))
                assert row[column] == pytest.approx(truth[column], abs=TOLERANCE_MS), (service, column, row)
            assert row["other_ms"] >= -TOLERANCE_MS, (service, row)
            if request["streaming"]:
                assert row["llm_ttft_ms"] >= FIRST_CHUNK_DELAY_MS
        figures[service] = f"{dict(statuses)}, max |llm_ttft/ttft - spans| {worst:.4f} ms"
    # each OpenInference request: ChatOpenAI around ChatCompletion, and the ensemble's two retrievers
    assert nested >= 3 * REQUESTS, nested
    with capsys.disabled():
        print(
            f"\nLangChain under real instrumentations: {REQUESTS} requests each; "
            + "; ".join(f"{s} {f}" for s, f in figures.items())
            + f"; {len(messages)} span messages, {int(nested)} spans counted once; services {service_s:.1f} s, "
            f"total {time.monotonic() - started:.1f} s"
        )
