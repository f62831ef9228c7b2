"""Issue 12 acceptance, end to end: rules that decide at a real tenant's rate, and replays that evaluate.

Real broker, join and writer workers, Debian Alertmanager and its webhook. The rules are the shipped ones
(``deploy/config/ttft.yaml``) except two settings about the end of the traffic, not about detection:
``stale_windows`` is long and tenant silence is off, because after historical traffic the idle watermark
jumps hours ahead and would otherwise resolve the alert by staleness instead of on data.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.alertmanager import AlertmanagerServer, wait_for
from tests.support.pipeline import produce_sync
from tests.support.scenarios import (
    PipelinePair,
    RegressionTraffic,
    historical_start_ms,
    read_topic,
    regression_traffic,
    run_ttft,
    whatif_json,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.alertmanager, pytest.mark.e2e]

TENANT, CONTROL, STAGE = "acme", "globex", "retrieval"
CONFIG: dict[str, Any] = {"rules": {"stale_windows": 2_000, "tenant_silence": {"enabled": False}}}
QUIET_S = 6.0
#: The last line of a firing TTFTStageRegression's description (streams/rules/regression_replay.py).
BASELINE_LINE = re.compile(r"^TTFT P95 with (\w+) at baseline: ([\d,]+) ms \(now ([\d,]+) ms\); ", re.M)


def _notified(am: AlertmanagerServer, status: str, **labels: str) -> list[dict[str, Any]]:
    return [
        a
        for a in am.webhook.alerts(status)
        if a["labels"].get("alertname") == "TTFTStageRegression"
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def _transitions(settings: Any, alertname: str = "TTFTStageRegression") -> list[dict[str, Any]]:
    out = []
    for _, value in read_topic(settings.kafka_bootstrap, settings.topic("alerts")):
        message = json.loads(value or b"{}")
        if message.get("alertname") == alertname:
            out.append(message)
    return out


def _start(settings: Any, home: Path, am: AlertmanagerServer) -> PipelinePair:
    config = write_config(home / "ttft.yaml", CONFIG)
    return PipelinePair.start(settings, home, TTFT_ALERTMANAGER_URL=am.url, TTFT_CONFIG=str(config))


def test_a_6_rps_tenant_regressing_x1_5_pages_once_and_resolves_once(
    kafka_settings: Any, alertmanager: AlertmanagerServer, tmp_path: Path
) -> None:
    before, incident, after = 10, 15, 3
    traffic = regression_traffic(
        historical_start_ms(hours_ago=3),
        tenants={TENANT: 6.0, CONTROL: 3.0},
        incident_tenant=TENANT,
        slowdown=1.5,
        windows_before=before,
        windows_incident=incident,
        windows_after=after,
        seed=12,
    )
    started = time.monotonic()
    pair = _start(kafka_settings, tmp_path, alertmanager)
    try:
        pair.check_event_time_before_traffic(traffic.start_ms)
        pair.produce_in_step(traffic.chunks[: before + incident], timeout_per_chunk=120)
        # While the worker runs (it holds the embedded store), the status comes from the topic.
        status = run_ttft(pair.env, "rules", "status", "--tenant", TENANT, timeout=60)
        pair.produce_in_step(traffic.chunks[before + incident :], timeout_per_chunk=120)
        assert wait_for(lambda: bool(_notified(alertmanager, "resolved")), timeout_s=180, interval_s=0.2), (
            f"notifications so far: {alertmanager.webhook.alerts()}\n{pair.writer.log()[-3000:]}"
        )
        time.sleep(QUIET_S)
        pair.stop()
    finally:
        pair.pipe.stop_all()
    elapsed = time.monotonic() - started
    firing, resolved = _notified(alertmanager, "firing"), _notified(alertmanager, "resolved")
    transitions = _transitions(kafka_settings)
    fired = [t for t in transitions if t["state"] == "firing"]
    detected_min = (fired[0]["fired_at"] - traffic.phase_starts["incident"]) / 60_000 if fired else None
    evaluations = pair.query(
        "SELECT outcome, span_windows, samples FROM {db}.rule_evaluations FINAL "
        f"WHERE tenant_id = '{TENANT}' AND rule = 'TTFTStageRegression' AND stage = '{STAGE}' "
        "ORDER BY window_start"
    )
    replayed = _replay_back(pair, traffic)
    described = fired[0]["annotations"].get("description", "").splitlines()[-1:] if fired else []
    print(
        f"{sum(traffic.requests.values())} requests in {elapsed:.0f} s; detected after {detected_min} min; "
        f"labels {firing[0]['labels'] if firing else {}}; spans {sorted({e['span_windows'] for e in evaluations})}"
        f"\n{status}\nfiring alert: {described}\nincident phase replayed: {replayed}"
    )
    assert len(firing) == 1 and len(resolved) == 1, (firing, resolved)
    assert firing[0]["labels"] == {
        "alertname": "TTFTStageRegression",
        "tenant": TENANT,
        "stage": STAGE,
        "severity": "page",
    }
    assert firing[0]["fingerprint"] == resolved[0]["fingerprint"]
    assert [(t["labels"]["tenant"], t["state"]) for t in transitions] == [
        (TENANT, "pending"),
        (TENANT, "firing"),
        (TENANT, "resolved"),
    ]
    assert detected_min is not None and 0 <= detected_min <= 8
    assert any(line.split()[:3] == [TENANT, "TTFTStageRegression", STAGE] for line in status.splitlines()), status
    assert {e["outcome"] for e in evaluations} >= {"ok", "breach"}
    assert "inconclusive" not in {e["outcome"] for e in evaluations}

    # Issue 26: the firing alert says what TTFT's P95 would be with the stage back at its baseline (its short
    # span replayed), in what Alertmanager paged; it is nearer the healthy phase's P95 than the P95 now.
    healthy = replayed["healthy_p95"]
    line = BASELINE_LINE.search(firing[0]["annotations"]["description"])
    assert line and line.group(1) == STAGE, firing[0]["annotations"]
    at_baseline, now = (float(line.group(i).replace(",", "")) for i in (2, 3))
    assert fired[0]["numbers"]["ttft_p95_at_baseline_ms"] == pytest.approx(at_baseline, abs=0.5)
    assert at_baseline < now and abs(at_baseline - healthy) < abs(now - healthy), (line.group(0), healthy)
    # The whole incident phase replayed with the stage scaled back to its baseline P95 predicts the healthy
    # phase's TTFT P95 within 5 %.
    assert abs(replayed["predicted_p95"] / healthy - 1.0) <= 0.05, replayed


def _replay_back(pair: PipelinePair, traffic: RegressionTraffic) -> dict[str, float]:
    """``ttft whatif`` over the stored incident phase with the regressed stage scaled back by its P95 ratio
    (healthy phase / incident phase), beside the healthy phase's observed TTFT P95."""
    healthy = (traffic.phase_starts["before"], traffic.phase_starts["incident"])
    incident = (traffic.phase_starts["incident"], traffic.phase_starts["after"])
    ranked = {
        name: whatif_json(pair.env, TENANT, start, end, "--rank", "--resamples", "20")
        for name, (start, end) in (("healthy", healthy), ("incident", incident))
    }
    stage_p95 = {name: next(r["stage_p95"] for r in out["rank"] if r["stage"] == STAGE) for name, out in ranked.items()}
    factor = stage_p95["healthy"] / stage_p95["incident"]
    back = whatif_json(pair.env, TENANT, *incident, "--scale", f"{STAGE}={factor:.4f}")
    return {
        "factor": factor,
        "incident_requests": float(back["requests"]),
        "incident_p95": float(back["observed"]["p95"]),
        "predicted_p95": float(back["predicted"]["p95"]),
        "healthy_p95": float(ranked["healthy"]["observed"]["p95"]),
    }


def test_a_replay_of_45_minutes_evaluates_each_window_once_and_pages_nothing(
    kafka_settings: Any, alertmanager: AlertmanagerServer, tmp_path: Path
) -> None:
    windows = 45
    traffic = regression_traffic(
        historical_start_ms(hours_ago=4),
        tenants={TENANT: 1.0},
        incident_tenant=TENANT,
        slowdown=1.5,
        windows_before=20,
        windows_incident=10,
        windows_after=windows - 30,
        seed=21,
    )
    pair = _start(kafka_settings, tmp_path, alertmanager)
    try:
        pair.check_event_time_before_traffic(traffic.start_ms)
        # History arrives as one backlog: 45 windows close (nearly) at once, as in a catch-up.
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), traffic.messages())
        pair.wait_drained(300, "the live run to drain")
        pair.stop()
    finally:
        pair.pipe.stop_all()
    paged_live = len(alertmanager.webhook.alerts())
    unmuted_live = [t for t in _transitions(kafka_settings) if not t["muted"]]
    replay_started = time.time()
    out = run_ttft(pair.env, "replay", "--from-time", str(traffic.start_ms - 60_000), "--timeout", "300", timeout=400)
    assert "paging muted" in out
    rows = pair.query(
        "SELECT toUnixTimestamp64Milli(window_start) AS ws, count() AS n, min(samples) AS samples "
        "FROM {db}.rule_evaluations "
        f"WHERE tenant_id = '{TENANT}' AND rule = 'TTFTStageRegression' AND stage = '{STAGE}' "
        f"AND inserted_at >= fromUnixTimestamp64Milli({int(replay_started * 1000)}) "
        "GROUP BY ws ORDER BY ws"
    )
    expected = [traffic.start_ms + i * traffic.window_ms for i in range(windows)]
    assert [int(r["ws"]) for r in rows] == expected, rows
    assert all(int(r["n"]) == 1 and int(r["samples"]) > 0 for r in rows), rows
    after_replay = _transitions(kafka_settings)
    muted = [t for t in after_replay if t["muted"]]
    # Everything the replay produced is muted: the delivery loop stores it and never pages it.
    assert muted and len(after_replay) == len(unmuted_live) + len(muted)
    stored = pair.query(
        "SELECT alertname, state, muted FROM {db}.alerts "
        f"WHERE inserted_at >= fromUnixTimestamp64Milli({int(replay_started * 1000)})"
    )
    assert stored and all(r["muted"] for r in stored), stored
    print(f"replay: {len(rows)} windows evaluated once each; {len(muted)} muted transitions; {out.strip()}")
    assert len(alertmanager.webhook.alerts()) == paged_live
