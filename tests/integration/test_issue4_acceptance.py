"""Issue 4 acceptance: a stage regression through broker -> worker -> Debian Alertmanager -> webhook.

Traffic: the fixed world for tenant ``acme`` at 2.5 req/s, historical, with its retrieval x1.5 slower for 4
of 15 one-minute windows (~2,200 requests), produced one window at a time once the pipeline caught up. The
rule spans are shortened in window units (the same rules as production, fewer windows) and the traffic
meets every sample gate. The outbox keeps alerts across an Alertmanager outage and a writer ``kill -9``.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.fixtures.alertmanager import AlertmanagerServer, FirstArrivals, wait_for
from tests.support.pipeline import REPO
from tests.support.scenarios import (
    PipelinePair,
    RegressionTraffic,
    historical_start_ms,
    read_topic,
    regression_traffic,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.alertmanager, pytest.mark.e2e]

TENANT, STAGE = "acme", "retrieval"
WINDOWS_BEFORE, WINDOWS_INCIDENT, WINDOWS_AFTER = 6, 4, 5
#: Alertmanager flushes every group_interval (1 s); a duplicate would show up well within this.
QUIET_S = 6.0

#: Production rules with shorter spans. Gates: ~150 requests per window, so the short span (100) and the
#: baseline (4 windows, 500) are met from the 7th window on; the other parent stages are the control.
#: ``stale_windows`` is long so that an alert only resolves on data (the idle watermark jumps hours ahead
#: after historical traffic). Windows and grace keep their defaults (60 s, 40 s): the traffic comes window by
#: window, so a window closes about two windows later with every record in, and the resolution (window 10-11)
#: closes while window 12 or 13 is produced, seconds after the firing one.
CONFIG: dict[str, Any] = {
    "rules": {
        "stale_windows": 2_000,
        "stage_regression": {
            "short_windows": 1,
            "long_windows": 3,
            "baseline_windows": 4,
            "exclude_recent_windows": 3,
            "min_recent_samples": 100,
            "min_baseline_samples": 500,
            "for_windows": 2,
            "resolve_windows": 2,
        },
        "tenant_silence": {"enabled": False},
    },
}


@pytest.fixture(scope="module")
def regression() -> RegressionTraffic:
    return regression_traffic(
        historical_start_ms(hours_ago=3),
        tenants={TENANT: 2.5},
        incident_tenant=TENANT,
        slowdown=1.5,
        windows_before=WINDOWS_BEFORE,
        windows_incident=WINDOWS_INCIDENT,
        windows_after=WINDOWS_AFTER,
        seed=5,
    )


def _start(settings: Any, home: Path, am: AlertmanagerServer) -> PipelinePair:
    config = write_config(home / "ttft.yaml", CONFIG)
    return PipelinePair.start(settings, home, TTFT_ALERTMANAGER_URL=am.url, TTFT_CONFIG=str(config))


def _notified(am: AlertmanagerServer, status: str, **labels: str) -> list[dict[str, Any]]:
    """Webhook alerts of TTFTStageRegression with ``status`` and the given labels."""
    return [
        a
        for a in am.webhook.alerts(status)
        if a["labels"].get("alertname") == "TTFTStageRegression"
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def _transitions(settings: Any) -> list[dict[str, Any]]:
    """TTFTStageRegression transitions on the ``alerts`` topic, in produce order."""
    out = []
    for _, value in read_topic(settings.kafka_bootstrap, settings.topic("alerts")):
        message = json.loads(value or b"{}")
        if message.get("alertname") == "TTFTStageRegression":
            out.append(message)
    return out


def _window_index(traffic: RegressionTraffic, ms: float | None) -> int | None:
    return None if ms is None else int((ms - traffic.start_ms) // traffic.window_ms)


def test_regression_arrives_once_and_resolves_once(
    kafka_settings: Any, alertmanager: AlertmanagerServer, tmp_path: Path, regression: RegressionTraffic
) -> None:
    started = time.monotonic()
    pair = _start(kafka_settings, tmp_path, alertmanager)
    arrivals = FirstArrivals(  # wall time of each notification's arrival, while traffic is still produced
        {
            status: partial(_notified, alertmanager, status, tenant=TENANT, stage=STAGE)
            for status in ("firing", "resolved")
        },
        started,
    )
    seen = arrivals.seen
    try:
        pair.check_event_time_before_traffic(regression.start_ms)
        pair.produce_in_step(regression.chunks, timeout_per_chunk=120)
        produced = time.monotonic() - started
        assert wait_for(arrivals.all_seen, timeout_s=120, interval_s=0.2), (
            f"notifications so far: {alertmanager.webhook.alerts()}\n{pair.writer.log()[-3000:]}"
        )
        time.sleep(QUIET_S)
        pair.stop()
    finally:
        arrivals.stop()
        pair.pipe.stop_all()
    firing = _notified(alertmanager, "firing")
    resolved = _notified(alertmanager, "resolved")
    transitions = _transitions(kafka_settings)
    path = [(t["labels"].get("tenant"), t["labels"].get("stage"), t["state"]) for t in transitions]
    fired = [t for t in transitions if t["state"] == "firing"]
    cleared = [t for t in transitions if t["state"] == "resolved"]
    fired_window = _window_index(regression, fired[0]["fired_at"]) if fired else None
    resolved_window = _window_index(regression, cleared[0]["resolved_at"]) if cleared else None
    print(
        f"produced {sum(regression.requests.values())} requests in {produced:.1f} s; webhook "
        f"firing at {seen.get('firing', 0):.1f} s, resolved at {seen.get('resolved', 0):.1f} s; "
        f"transitions {path}; fired in window {fired_window}, resolved in window {resolved_window} "
        f"(incident: windows {WINDOWS_BEFORE}-{WINDOWS_BEFORE + WINDOWS_INCIDENT - 1}); "
        f"labels {firing[0]['labels'] if firing else {}}"
    )
    assert len(firing) == 1, firing
    assert len(resolved) == 1, resolved
    assert firing[0]["labels"]["tenant"] == TENANT and firing[0]["labels"]["stage"] == STAGE
    assert firing[0]["fingerprint"] == resolved[0]["fingerprint"]
    assert path == [(TENANT, STAGE, "pending"), (TENANT, STAGE, "firing"), (TENANT, STAGE, "resolved")]
    assert fired_window is not None and resolved_window is not None
    assert WINDOWS_BEFORE <= fired_window < WINDOWS_BEFORE + WINDOWS_INCIDENT
    assert resolved_window >= WINDOWS_BEFORE + WINDOWS_INCIDENT
    # Issue 28: the page leads somewhere: its board filtered on tenant, stage and time, the runbook the
    # deployment serves (pipeline_env: this checkout's), and slow requests of the tenant from tail attribution.
    alert = firing[0]
    board = urlsplit(alert["generatorURL"])
    assert alert["generatorURL"] == alert["annotations"]["dashboard_url"] and board.path == "/d/ttft-stages"
    query = parse_qs(board.query)
    assert query["var-tenant"] == [TENANT.encode().hex().upper()] and query["var-stage"] == [STAGE]
    assert int(query["from"][0]) < fired[0]["fired_at"] < int(query["to"][0])
    assert alert["annotations"]["runbook_url"] == (REPO / "docs" / "runbook.md").as_uri() + "#ttftstageregression"
    exemplars = json.loads(alert["annotations"]["exemplar_request_ids"])
    produced_ids = {key.decode() for key, _ in regression.messages()}
    assert 1 <= len(exemplars) <= 3 and set(exemplars) <= produced_ids, exemplars


def test_firing_alert_survives_alertmanager_outage_and_writer_restart(
    kafka_settings: Any,
    alertmanager_server: AlertmanagerServer,
    tmp_path: Path,
    regression: RegressionTraffic,
) -> None:
    am = alertmanager_server  # not started: Alertmanager is down while the alert fires
    am.reserve()  # its port refuses connections until it starts, and no other server takes it meanwhile
    started = time.monotonic()
    pair = _start(kafka_settings, tmp_path, am)
    try:
        pair.check_event_time_before_traffic(regression.start_ms)
        # Only the windows up to the end of the incident: the alert fires and stays firing.
        pair.produce_in_step(regression.chunks[: WINDOWS_BEFORE + WINDOWS_INCIDENT], timeout_per_chunk=120)
        pair.pipe.wait_for(
            lambda: any(t["state"] == "firing" for t in _transitions(kafka_settings)),
            240,
            "TTFTStageRegression to fire on the alerts topic",
        )
        fired_at = time.monotonic() - started
        time.sleep(2.0)  # the delivery loop has tried (and failed) to post it
        assert am.received == []
        pair.kill_writer()
        pair.start_writer()
        restarted_at = time.monotonic() - started
        am.start()
        am_up = time.monotonic() - started
        assert wait_for(
            lambda: bool(_notified(am, "firing", tenant=TENANT, stage=STAGE)), timeout_s=120, interval_s=0.2
        ), f"no notification after Alertmanager came back:\n{pair.writer.log()[-3000:]}"
        arrived = time.monotonic() - started
        time.sleep(QUIET_S)
        pair.stop()
    finally:
        pair.pipe.stop_all()
    firing = _notified(am, "firing")
    print(
        f"fired on the topic at {fired_at:.1f} s, writer restarted at {restarted_at:.1f} s, Alertmanager up "
        f"at {am_up:.1f} s, webhook notified at {arrived:.1f} s ({arrived - am_up:.1f} s after); "
        f"labels {firing[0]['labels'] if firing else {}}"
    )
    assert len(firing) == 1, firing
    assert firing[0]["labels"]["tenant"] == TENANT and firing[0]["labels"]["stage"] == STAGE
    assert _notified(am, "resolved") == []
