from __future__ import annotations

import io

import orjson
from rich.console import Console

from streams.views.breakdown import Breakdown, render_breakdown
from streams.views.report import TenantReport, _completeness_series
from streams.views.report_html import _tenant_section
from streams.views.span import Span
from streams.views.summary import Completeness, LlmSignals, StageStat, TailSummary, sum_health
from streams.views.top import TopModel, frame_text

WS = 1_800_000_000_000
#: One window of one tenant: 100 records, 20 of them answered with no first chunk in their telemetry.
HEALTH = {
    "window_start": WS,
    "tenant_id": "rag",
    "version_id": "v1",
    "total": 100,
    "complete": 70,
    "missing_stage": 5,
    "no_first_chunk": 20,
    "timed_out": 4,
    "orphan": 1,
}


def _ttft(count: int, slo_bad: int) -> StageStat:
    return StageStat("ttft", "ttft", None, count, 800.0, 1100.0, 1200.0, 1500.0, 2000.0, 1, slo_bad_count=slo_bad)


def test_completeness_counts_no_first_chunk_and_leaves_it_out_of_the_slo_total() -> None:
    c = sum_health([HEALTH, {**HEALTH, "window_start": WS + 60_000}])
    assert (c.total, c.no_first_chunk, c.slo_total) == (200, 40, 160)
    data = c.to_json()
    assert data["no_first_chunk"] == 40 and data["no_first_chunk_share"] == 0.2
    assert sum_health([{k: v for k, v in HEALTH.items() if k != "no_first_chunk"}]).no_first_chunk == 0


def test_breakdown_lists_no_first_chunk_and_its_slo_share_leaves_them_out() -> None:
    bd = Breakdown(
        tenant="rag",
        version=None,
        span=Span(WS, WS + 60_000, "absolute"),
        versions=["v1"],
        stages=[],
        ttft=_ttft(75, slo_bad=8),
        parent_p95_sum=None,
        slo_ms=1000.0,
        tail=TailSummary(),
        completeness=sum_health([HEALTH]),
        signals=LlmSignals(),
        cut_first="",
        reason="too few requests",
        windows=1,
    )
    assert bd.slo_bad_share == 8 / 80  # timed-out and orphan records count, unknown TTFTs do not
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_breakdown(console, bd)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "missing stage 5.0 %, no first chunk 20.0 %, timed out 4.0 %, orphan 1.0 %" in text
    assert bd.to_json()["completeness"]["no_first_chunk_share"] == 0.2
    html = _tenant_section(TenantReport(breakdown=bd))
    assert "20.0 % without a first chunk in their telemetry" in html


def test_top_shows_no_first_chunk_from_the_window_health_topic() -> None:
    model = TopModel()
    model.fold("window-health", orjson.dumps(HEALTH))
    (panel,) = model.frame(lambda _tenant: 1000.0).tenants
    assert panel.completeness.no_first_chunk == 20 and panel.completeness.slo_total == 80
    text = frame_text(model.frame(lambda _tenant: 1000.0), width=160)
    assert "no first chunk 20.0 %" in text


def test_report_completeness_series_has_the_no_first_chunk_share() -> None:
    (point,) = _completeness_series([HEALTH], "rag")
    assert point["no_first_chunk"] == 20 and point["no_first_chunk_share"] == 0.2
    assert Completeness().slo_total == 0
