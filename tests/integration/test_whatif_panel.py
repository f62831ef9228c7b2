"""The stage drill-down's "What if" panel, its SQL expanded as the plugin does, on a real chDB store, against
the pure replay (:mod:`streams.core.whatif`) of the same requests: every interval's observed and predicted
TTFT P95 equal to the bit, for every lever stage, serial and parallel recall, missing sub-stages, a recall
mode the join could not tell, a scale above 1; and a crafted ``$scale`` draws only the observed series."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from streams.core.whatif import RequestColumns, replay
from streams.core.whatif_levers import LEVER_STAGES, Scale
from streams.core.whatif_stats import lower_quantiles
from streams.grafana.build import dashboard_specs, repo_settings
from streams.grafana.macros import QueryContext, Variable, expand_query, panel_interval_ms
from streams.grafana.panels_whatif import OBSERVED, SCALES
from streams.store.requests_store import insert_requests
from tests.support.panel_check import hex_value
from tests.support.window_records import HOUR_START_MS, WINDOW_MS, synthetic_records

pytestmark = pytest.mark.clickhouse

WINDOWS = 12
#: (interval start ms, series) -> TTFT P95
P95s = dict[tuple[int, str], float]
START, END = HOUR_START_MS, HOUR_START_MS + WINDOWS * WINDOW_MS


def _records() -> list[dict[str, Any]]:
    records = synthetic_records(2_400, span_ms=WINDOWS * WINDOW_MS, tenants=("acme", "globex"))
    for i, r in enumerate(records):
        if r["status"] != "complete":
            continue
        if i % 3 == 0:  # serial recall: both legs and rerank inside retrieval
            r["recall_mode"] = "serial" if i % 2 else None
            r["retrieval_ms"] = r["vector_recall_ms"] + r["bm25_recall_ms"] + r["rerank_ms"] + 0.5
        elif i % 5 == 0:
            r["rerank_ms"] = None
        elif i % 7 == 0:
            r |= {"vector_recall_ms": None, "recall_mode": "single"}
        elif i % 11 == 0:
            r["recall_mode"] = None  # unknown overlap, legs not fitting: not serial
        r["ttft_ms"] = r["retrieval_ms"] + r["prompt_assemble_ms"] + r["llm_ttft_ms"] + r["other_ms"]
        r["first_token_at"] = r["started_at"] + r["ttft_ms"]
    return records


def _panel_sql() -> tuple[str, int]:
    (board,) = [d for d in dashboard_specs(repo_settings()) if d.uid == "ttft-stages"]
    (panel,) = [p for p in board.panels if p.whatif is not None]
    return panel.sql, panel_interval_ms(START, END, 500, "1m")


def _run(client: Client, db: str, variables: dict[str, Variable]) -> P95s:
    sql, interval = _panel_sql()
    expanded = expand_query(sql, QueryContext(START, END - 1, interval), variables)
    rows = client.query(expanded.replace("FROM requests FINAL", f"FROM {db}.requests FINAL")).result_rows
    return {(int(time.timestamp() * 1000), str(series)): float(p95) for time, series, p95 in rows}


def _expected(
    records: list[dict[str, Any]], stages: tuple[str, ...], scale: str, tenant: str | None
) -> dict[Any, float]:
    by_window: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if tenant is None or r["tenant_id"] == tenant:
            by_window[int(r["window_start"])].append(r)
    out: P95s = {}
    for ws, rows in by_window.items():
        columns = RequestColumns.from_records(rows)
        if not columns.n:
            continue
        out[(ws, OBSERVED)] = lower_quantiles(columns.ttft, [0.95])[0]
        for stage in stages:
            predicted = replay(columns, [Scale(stage, float(scale))]).predicted
            out[(ws, f"{stage} x{float(scale):g}")] = lower_quantiles(predicted, [0.95])[0]
    return out


def test_the_what_if_panel_equals_the_pure_replay(ch_client: Client, ch_database: str) -> None:
    records = _records()
    insert_requests(ch_client, ch_database, records)
    tenants = ("acme", "globex")
    every = {
        "tenant": Variable("tenant", tuple(hex_value(t) for t in tenants)),
        "version": Variable("version", (hex_value("v1"), hex_value("v2"))),
        "stage": Variable("stage", ("llm_ttft", "retrieval", "ttft", *LEVER_STAGES)),
    }
    for scale in ("0.8", "1.5"):
        got = _run(ch_client, ch_database, {**every, "scale": Variable("scale", SCALES, (scale,))})
        want = _expected(records, LEVER_STAGES, scale, None)
        assert got.keys() == want.keys()
        assert got == want  # exact: the same IEEE arithmetic in the same order
        assert all(got[(ws, f"llm_ttft x{float(scale):g}")] != got[(ws, OBSERVED)] for ws, _ in got)

    # One tenant, two stages selected (one without a lever): its observed series and one predicted one.
    chosen = {
        "tenant": Variable("tenant", every["tenant"].options, (hex_value("globex"),)),
        "version": every["version"],
        "stage": Variable("stage", every["stage"].options, ("rerank", "ttft")),
        "scale": Variable("scale", SCALES, ("0.5",)),
    }
    got = _run(ch_client, ch_database, chosen)
    assert got == _expected(records, ("rerank",), "0.5", "globex")

    # A crafted value (a URL's var-scale) parses to NULL: the observed series only, no error.
    for hostile in ("0.8') OR 1=1 --", "-1", "nan", "1e999"):
        got = _run(ch_client, ch_database, {**every, "scale": Variable("scale", SCALES, (hostile,))})
        assert {series for _, series in got} == {OBSERVED}, hostile
