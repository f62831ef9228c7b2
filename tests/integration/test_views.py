from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from clickhouse_connect.driver.client import Client

from streams.core.windows import aggregate_windows
from streams.rules.model import ALERT_COLUMNS, AlertTransition
from streams.settings import PARENT_STAGES, Settings
from streams.store.aggregates_store import insert_window_aggregates
from streams.store.requests_store import insert_requests
from streams.views.breakdown import compute_breakdown
from streams.views.reads import store_span
from streams.views.report import build_report
from streams.views.span import Span, SpanError, resolve_span
from tests.support.recent import iso_utc
from tests.support.window_records import HOUR_START_MS, WINDOW_MS, synthetic_records

TENANTS = ("acme", "globex")
WINDOWS = 10
SPAN = Span(HOUR_START_MS, HOUR_START_MS + WINDOWS * WINDOW_MS, "absolute")
SETTINGS = Settings()


def _fill(client: Client, database: str) -> list[dict[str, Any]]:
    """10 windows x 2 tenants x 2 versions; v2 is the canary arm (rollout) and its LLM stage is faster."""
    records = synthetic_records(10_000, span_ms=WINDOWS * WINDOW_MS, tenants=TENANTS)
    for r in records:
        r["rollout"] = "canary" if r["version_id"] == "v2" else "stable"
    insert_requests(client, database, records)
    for agg in aggregate_windows(records, SETTINGS).values():
        insert_window_aggregates(
            client,
            database,
            {
                "stage_windows": agg.stage_windows,
                "tail_attribution": agg.tail_attribution,
                "window_health": agg.window_health,
                "llm_signals": agg.llm_signals,
            },
        )
    return records


def _insert_alerts(client: Client, database: str) -> None:
    labels = {
        "alertname": "TTFTCanaryFailed",
        "tenant": "acme",
        "stage": "llm_ttft",
        "version": "v2",
        "severity": "page",
    }
    at = HOUR_START_MS + 2 * WINDOW_MS
    steps = [
        AlertTransition("TTFTCanaryFailed", labels, {"summary": "canary"}, {}, "pending", at, at),
        AlertTransition("TTFTCanaryFailed", labels, {"summary": "canary"}, {}, "firing", at, at, at + WINDOW_MS),
        AlertTransition(
            "TTFTCanaryFailed",
            labels,
            {"summary": "canary"},
            {},
            "resolved",
            at,
            at,
            at + WINDOW_MS,
            at + 5 * WINDOW_MS,
        ),
    ]
    rows = [t.to_row() for t in steps]
    client.insert(
        "alerts",
        [[r[c] for c in ALERT_COLUMNS] for r in rows],
        column_names=list(ALERT_COLUMNS),
        database=database,
    )


def _walk(bins: dict[int, int], zero_count: int, q: float, accuracy: float = 0.01) -> float | None:
    """Hand-written quantile of a merged sketch: numpy 'lower' rank, bin representative 2 g^k / (g + 1)."""
    n = zero_count + sum(bins.values())
    if n == 0:
        return None
    rank = math.floor(q * (n - 1))
    if rank < zero_count:
        return 0.0
    gamma = (1 + accuracy) / (1 - accuracy)
    seen = zero_count
    for key in sorted(bins):
        seen += bins[key]
        if seen > rank:
            return 2 * gamma**key / (gamma + 1)
    raise AssertionError("rank beyond the sketch")


def _approx(value: Any) -> Any:
    # The project's bin_value computes gamma**k by squaring; the walk above uses pow(): last-bit differences.
    return pytest.approx(value, rel=1e-12)


def _span_where() -> str:
    return (
        f"window_start >= fromUnixTimestamp64Milli({SPAN.start_ms}, 'UTC') "
        f"AND window_start < fromUnixTimestamp64Milli({SPAN.end_ms}, 'UTC')"
    )


def _sql_stage_p95(client: Client, db: str, tenant: str, extra: str = "") -> dict[str, tuple[int, float | None]]:
    rows = client.query(
        f"SELECT stage, sum(count), sumMap(bins), sum(zero_count) FROM {db}.stage_windows FINAL "
        f"WHERE tenant_id = '{tenant}' AND {_span_where()} {extra} GROUP BY stage"
    ).result_rows
    return {r[0]: (int(r[1]), _walk(dict(r[2]), int(r[3]), 0.95)) for r in rows}


@pytest.mark.clickhouse
def test_breakdown_numbers_equal_hand_written_sql(ch_client: Client, ch_database: str) -> None:
    records = _fill(ch_client, ch_database)
    bd = compute_breakdown(ch_client, ch_database, SETTINGS, SPAN, tenant="acme")
    expected = _sql_stage_p95(ch_client, ch_database, "acme")

    table = {s.stage: s for s in bd.stages}
    assert set(table) | {"ttft"} == set(expected)
    for stage, stat in table.items():
        assert (stat.count, stat.p95) == _approx(expected[stage]), stage
    assert bd.ttft is not None and (bd.ttft.count, bd.ttft.p95) == _approx(expected["ttft"])
    parents = [s.stage for s in bd.stages if s.kind == "parent"]
    assert parents == sorted(PARENT_STAGES, key=lambda s: -(expected[s][1] or 0.0))  # sorted by size
    assert bd.parent_p95_sum == pytest.approx(sum(expected[s][1] or 0.0 for s in PARENT_STAGES), rel=1e-12)
    assert bd.parent_p95_sum != pytest.approx(bd.ttft_p95, rel=0.01)

    # Independent of sketches: numpy over the raw records is within the 1 % relative accuracy.
    sketched = [r for r in records if r["tenant_id"] == "acme" and r["status"] in ("complete", "missing_stage")]
    exact = float(np.quantile([r["ttft_ms"] for r in sketched], 0.95, method="lower"))
    assert bd.ttft_p95 == pytest.approx(exact, rel=0.01)

    status: dict[str, int] = dict(
        ch_client.query(  # type: ignore[arg-type]
            f"SELECT status, count() FROM {ch_database}.requests FINAL WHERE tenant_id = 'acme' GROUP BY status"
        ).result_rows
    )
    c = bd.completeness
    assert (c.complete, c.missing_stage, c.timed_out, c.orphan) == tuple(
        status.get(s, 0) for s in ("complete", "missing_stage", "timed_out", "orphan")
    )
    assert c.total == sum(status.values())

    tail = ch_client.query(
        f"SELECT sum(tail_share['llm_ttft'] * tail_count) / sum(tail_count), "
        f"sum(band_share['llm_ttft'] * band_count) / sum(band_count), count() "
        f"FROM {ch_database}.tail_attribution FINAL WHERE tenant_id = 'acme' AND status = 'ok'"
    ).result_rows[0]
    assert bd.tail.windows_ok == tail[2] > 0
    assert bd.tail.tail_share["llm_ttft"] == pytest.approx(tail[0], rel=1e-9)
    assert bd.tail.band_share["llm_ttft"] == pytest.approx(tail[1], rel=1e-9)
    slowest = ch_client.query(
        f"SELECT argMax(request_id, ttft_ms), max(ttft_ms) FROM {ch_database}.requests FINAL "
        "WHERE tenant_id = 'acme' AND status = 'complete'"
    ).result_rows[0]
    assert bd.tail.exemplars[0][0] == slowest[0]
    assert bd.tail.exemplars[0][1] == pytest.approx(slowest[1])
    assert bd.cut_first == "llm_ttft" and bd.tail.biggest_p95_stage == "llm_ttft"
    assert bd.reason


@pytest.mark.clickhouse
def test_report_numbers_equal_hand_written_sql(ch_client: Client, ch_database: str, tmp_path: Path) -> None:
    _fill(ch_client, ch_database)
    _insert_alerts(ch_client, ch_database)
    data = build_report(ch_client, ch_database, SETTINGS, SPAN, tmp_path, tenants=["acme"])

    for name in ("index.html", "report.json", *data.charts):
        assert (tmp_path / name).stat().st_size > 0, name
    assert len(data.charts) == 6
    assert all((tmp_path / c).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for c in data.charts)
    report = json.loads((tmp_path / "report.json").read_text())
    html = (tmp_path / "index.html").read_text()
    assert report["verdict"] in html.replace("&#x27;", "'")
    assert report["verdict"].startswith("acme: TTFT P95") and "Cut llm_ttft first" in report["verdict"]
    acme = report["tenants"]["acme"]

    # P95 over time: one point per window (10 windows <= 120 points), all versions merged.
    per_window = ch_client.query(
        f"SELECT toUnixTimestamp64Milli(window_start) AS ws, sumMap(bins), sum(zero_count) "
        f"FROM {ch_database}.stage_windows FINAL "
        f"WHERE tenant_id = 'acme' AND stage = 'ttft' AND {_span_where()} "
        "GROUP BY ws ORDER BY ws"
    ).result_rows
    assert [(p["window_start"], p["p95"]["ttft"]) for p in acme["p95_series"]] == [
        (int(r[0]), _approx(_walk(dict(r[1]), int(r[2]), 0.95))) for r in per_window
    ]

    # Canary arms: versions served with rollout = 'canary' in requests, bins merged per arm.
    for arm in ("canary", "stable"):
        expected = _sql_stage_p95(
            ch_client,
            ch_database,
            "acme",
            f"AND version_id IN (SELECT version_id FROM {ch_database}.requests FINAL "
            "WHERE tenant_id = 'acme' "
            f"GROUP BY version_id HAVING countIf(rollout = '{arm}') > countIf(rollout != '{arm}'))",
        )
        got = acme["canary"]["stages"][arm]
        assert {s: (v["count"], v["p95"]) for s, v in got.items()} == {s: _approx(v) for s, v in expected.items()}
    assert acme["canary"]["arms"] == {"v1": "stable", "v2": "canary"}
    # Both arms had traffic in every window: all ten are compared, the same for both arms.
    assert acme["canary"]["windows"] == [HOUR_START_MS + i * WINDOW_MS for i in range(WINDOWS)]
    assert acme["canary"]["span"].startswith(f"over {WINDOWS} windows where both arms had traffic")

    # Completeness per window straight from the records.
    status = ch_client.query(
        f"SELECT toUnixTimestamp64Milli(window_start) AS ws, count(), countIf(status = 'complete'), "
        f"countIf(status = 'timed_out') FROM {ch_database}.requests FINAL WHERE tenant_id = 'acme' "
        "GROUP BY ws ORDER BY ws"
    ).result_rows
    assert [(p["window_start"], p["total"], p["complete"], p["timed_out"]) for p in acme["completeness_series"]] == [
        tuple(int(x) for x in r) for r in status
    ]

    breakdown = compute_breakdown(ch_client, ch_database, SETTINGS, SPAN, tenant="acme").to_json()
    assert acme["breakdown"]["stages"] == breakdown["stages"]
    assert acme["breakdown"]["ttft_p95"] == breakdown["ttft_p95"]

    (alert,) = report["alerts"]
    assert alert["alertname"] == "TTFTCanaryFailed"
    assert (alert["active_at"], alert["fired_at"], alert["resolved_at"]) == (
        HOUR_START_MS + 2 * WINDOW_MS,
        HOUR_START_MS + 3 * WINDOW_MS,
        HOUR_START_MS + 7 * WINDOW_MS,
    )


@pytest.mark.clickhouse
def test_breakdown_cli_smoke(
    ch_client: Client, ch_database: str, ch_session_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.cli.main import main

    _fill(ch_client, ch_database)
    # The same chDB directory as the session client: make_client returns that process-wide client.
    monkeypatch.setenv("TTFT_CLICKHOUSE_URL", f"chdb://{ch_session_path}")
    monkeypatch.setenv("TTFT_CLICKHOUSE_DATABASE", ch_database)
    runner = CliRunner()
    result = runner.invoke(main, ["breakdown", "--tenant", "acme", "--since", "1h", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["span"]["end_ms"] == SPAN.end_ms  # anchored on the newest stored window, not the wall clock
    in_process = compute_breakdown(ch_client, ch_database, SETTINGS, SPAN, tenant="acme")
    assert payload["ttft_p95"] == in_process.ttft_p95 and payload["cut_first"] == "llm_ttft"

    text = runner.invoke(main, ["breakdown", "--since", "10m"], terminal_width=140)
    assert text.exit_code == 0, text.output
    assert "cut llm_ttft first" in text.output and "acme" in text.output and "globex" in text.output
    assert "sum of parent stage P95s" in text.output and "they differ" in text.output

    span = store_span(ch_client, ch_database, "5m", None, window_ms=WINDOW_MS, now_ms=0.0)
    assert (span.start_ms, span.end_ms) == (SPAN.end_ms - 5 * WINDOW_MS, SPAN.end_ms)


def test_span_resolution() -> None:
    newest = HOUR_START_MS + 10 * WINDOW_MS
    assert resolve_span("1h", None, newest_end_ms=newest, now_ms=9e12) == Span(newest - 3_600_000, newest, "data")
    assert resolve_span("1h", None, newest_end_ms=newest, now_ms=9e12, anchor="now").end_ms == int(9e12)
    assert resolve_span("2h", "1h", newest_end_ms=newest, now_ms=0).duration_ms == 3_600_000
    assert resolve_span("1h30m", None, newest_end_ms=None, now_ms=1e13).anchor == "now"
    iso = resolve_span(iso_utc(HOUR_START_MS), iso_utc(HOUR_START_MS + 300_000)[:-1], newest_end_ms=newest, now_ms=0)
    assert iso == Span(HOUR_START_MS, HOUR_START_MS + 300_000, "absolute")
    with pytest.raises(SpanError):
        resolve_span("yesterday", None, newest_end_ms=newest, now_ms=0)
    with pytest.raises(SpanError):
        resolve_span(iso_utc(HOUR_START_MS + 300_000), iso_utc(HOUR_START_MS), newest_end_ms=newest, now_ms=0)
