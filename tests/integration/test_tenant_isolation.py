"""Issue 14 acceptance: one hostile tenant changes nothing for the others (real broker, join and writer).

Three well-behaved tenants' seeded traffic (one of them regresses, so an alert fires and resolves) runs
twice through fresh topics and a fresh store: alone, then with a hostile tenant mixed into every window
that does all of issue 14's items 2, 3, 4, 5, 7 and 8 at once (>= 50,000 hostile events). For the good
tenants, ``requests FINAL``, ``stage_windows``, ``window_health`` and the alert transitions must be
identical between the runs; every bound must have tripped; every hostile event must be in the hostile
tenant's own rows or in ``dead_letters``.

Ingestion bookkeeping left out of the comparison: ``inserted_at`` (wall time of the insert) and
``computed_version`` (wall-time version of a window computation).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from streams.kafka.topics import ensure_topics
from streams.settings import Settings, load_settings
from tests.support.pipeline import produce_sync
from tests.support.scenarios import (
    PipelinePair,
    RegressionTraffic,
    historical_start_ms,
    regression_traffic,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(600)]

GOOD = {"acme": 6.0, "globex": 2.0, "initech": 1.0}
HOSTILE = "mallory"
GOOD_SQL = ", ".join(f"'{t}'" for t in GOOD)
CONFIG: dict[str, Any] = {
    "rules": {"stale_windows": 2_000, "tenant_silence": {"enabled": False}},
    "join": {"max_open_requests_per_tenant": 1_000},
}
Msg = tuple[bytes, bytes]


def _settings(bootstrap: str, home: Path) -> Settings:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = load_settings(kafka_bootstrap=bootstrap, home=home, topic_prefix=prefix, app_id=prefix)
    asyncio.run(ensure_topics(settings))
    return settings


def _event(rid: str, stage: str, ts: float, **extra: Any) -> dict[str, Any]:
    return {"request_id": rid, "tenant_id": HOSTILE, "version_id": "h1", "stage": stage, "ts_ms": ts, **extra}


def _request(rid: str, t: float, version: str, route: str, custom: str) -> list[dict[str, Any]]:
    """A complete request of the hostile tenant, with its own version, route and custom stage (item 5)."""
    base = {"version_id": version, "route": route}
    return [
        _event(rid, "request_start", t, **base),
        _event(rid, "retrieval", t + 5, duration_ms=90.0, **base),
        _event(rid, custom, t + 96, duration_ms=3.0, **base),
        _event(rid, "prompt_assemble", t + 100, duration_ms=30.0, **base),
        _event(rid, "llm_ttft", t + 131, duration_ms=400.0, **base),
        _event(rid, "first_token", t + 532, **base),
    ]


def _hostile_window(
    index: int, last: int, start: float, good_ids: list[str], rng: random.Random
) -> list[tuple[float, Msg]]:
    """The hostile tenant's events of one window, each with the event time it is produced at."""
    events: list[dict[str, Any]] = []
    raw: list[tuple[float, Msg]] = []
    for k, rid in enumerate(good_ids[:60]):  # 4: the good tenants' request ids; 5: a version per request
        events += _request(rid, start + 500 + k * 400, f"v{index}-{k}", f"route-{index}-{k}", f"hx_{index}_{k}")
    for k in range(1_600):  # 5: open requests past the per-tenant cap (evicted: the tenant's own)
        events.append(_event(f"open-{index}-{k}", "request_start", start + k * 30.0))
    for k in range(10):  # 8: conflicting duplicates (same event id, another duration) and duplicate keys
        t = start + 20_000 + k * 100
        first = _event(f"conflict-{index}-{k}", "retrieval", t, duration_ms=50.0, event_id=f"e{index}-{k}")
        events += [first, {**first, "duration_ms": 70.0}]
        dup = orjson.dumps(_event(f"dupkey-{index}-{k}", "request_start", t))[:-1] + b',"version_id":"h2"}'
        raw.append((t, (f"dupkey-{index}-{k}".encode(), dup)))
    for k in range(5):  # 2: 24 h ahead of the clock (dead-lettered)
        events.append(_event(f"skew-{index}-{k}", "retrieval", start + 86_400_000, duration_ms=5.0))
    if index == last:  # 2: 12 min ahead of its own watermark, which one event moves by 10 min at most
        for k in range(40):
            events.append(_event(f"ahead-{index}-{k}", "retrieval", start + 40_000 + 720_000, duration_ms=5.0))
    if index == 2:  # 3: a constant request id, 20,000 events
        for k in range(20_000):
            stage = ("request_start", "retrieval", "llm_ttft", "first_token")[k % 4]
            extra = {"duration_ms": 2.0} if stage in ("retrieval", "llm_ttft") else {}
            events.append(_event("unknown", stage, start + 1_000 + k * 2.0, **extra))
    if index == 4:  # 7: a bad deploy, every event invalid (negative duration), 8,000 in 20 s
        for k in range(8_000):
            events.append(_event(f"bad-{index}-{k}", "retrieval", start + 1_000 + k * 2.5, duration_ms=-1.0))
    rng.shuffle(events)  # arrival order within a window is not event-time order
    out = [(e["ts_ms"], (e["request_id"].encode(), orjson.dumps(e))) for e in events]
    return out + raw


def _mixed(traffic: RegressionTraffic, seed: int) -> tuple[list[list[Msg]], int]:
    """The good chunks with the hostile events interleaved (by event time within each window)."""
    rng = random.Random(seed)
    chunks: list[list[Msg]] = []
    total = 0
    for index, chunk in enumerate(traffic.chunks):
        start = traffic.start_ms + index * traffic.window_ms
        good = [(orjson.loads(v)["ts_ms"], (k, v)) for k, v in chunk]
        good_ids = list(dict.fromkeys(k.decode() for _, (k, _) in good))
        hostile = _hostile_window(index, len(traffic.chunks) - 1, start, good_ids, rng)
        total += len(hostile)
        merged = sorted(
            [(t, 0, i, m) for i, (t, m) in enumerate(good)] + [(t, 1, i, m) for i, (t, m) in enumerate(hostile)]
        )
        chunks.append([m for *_, m in merged])
    return chunks, total


def _run(settings: Settings, home: Path, chunks: list[list[Msg]]) -> tuple[PipelinePair, dict[str, float]]:
    """Produce everything, then start the workers: the traffic is one backlog, so no pause of the producer
    ever looks like idle time to the join (its idle tick is wall time, the one input that differs between
    two runs) and both runs see the same event-time progression."""
    config = write_config(home / "ttft.yaml", CONFIG)
    produce_sync(settings.kafka_bootstrap, settings.topic("stage-events"), [m for chunk in chunks for m in chunk])
    pair = PipelinePair.start(settings, home, TTFT_CONFIG=str(config))
    try:
        pair.wait_drained(300)
        metrics = pair.writer.metrics()  # both processes export every counter: add them up
        for name, value in pair.join.metrics().items():
            metrics[name] = metrics.get(name, 0.0) + value
        assert pair.join.alive() and pair.writer.alive(), "a worker restarted"
        pair.stop()
    finally:
        pair.pipe.stop_all()
    return pair, metrics


def _tables(pair: PipelinePair) -> dict[str, list[dict[str, Any]]]:
    where = f"WHERE tenant_id IN ({GOOD_SQL})"
    return {
        "requests": pair.query(
            f"SELECT * EXCEPT (inserted_at) FROM {{db}}.requests FINAL {where} ORDER BY tenant_id, request_id"
        ),
        "stage_windows": pair.query(
            f"SELECT * EXCEPT (computed_version) FROM {{db}}.stage_windows FINAL {where} "
            "ORDER BY tenant_id, version_id, stage, window_start"
        ),
        "window_health": pair.query(
            f"SELECT * EXCEPT (computed_version) FROM {{db}}.window_health FINAL {where} "
            "ORDER BY tenant_id, version_id, window_start"
        ),
        "alerts": pair.query(
            "SELECT fingerprint, alertname, tenant_id, stage, state, event_at FROM {db}.alerts FINAL "
            f"{where} AND alertname != 'Watchdog' ORDER BY fingerprint, event_at, state"
        ),
    }


def test_a_hostile_tenant_changes_nothing_for_the_others(kafka_broker: Any, tmp_path: Path) -> None:
    traffic = regression_traffic(
        historical_start_ms(hours_ago=3),
        tenants=GOOD,
        incident_tenant="acme",
        slowdown=1.5,
        windows_before=5,
        windows_incident=5,
        windows_after=3,
        seed=14,
    )
    kafka_broker.ensure_running()
    alone_home, mixed_home = tmp_path / "alone", tmp_path / "mixed"
    alone_home.mkdir()
    mixed_home.mkdir()
    started = time.monotonic()
    alone, _ = _run(_settings(kafka_broker.bootstrap, alone_home), alone_home, traffic.chunks)
    alone_s = time.monotonic() - started
    chunks, hostile_sent = _mixed(traffic, seed=41)
    mixed, metrics = _run(_settings(kafka_broker.bootstrap, mixed_home), mixed_home, chunks)
    print(f"RUNS: alone {alone_s:.0f} s, mixed {time.monotonic() - started - alone_s:.0f} s")

    before, after = _tables(alone), _tables(mixed)
    counts = {name: (len(before[name]), len(after[name])) for name in before}
    print("GOOD TENANTS' ROWS (alone, mixed):", counts)
    assert any(a["state"] == "firing" for a in before["alerts"]) and any(
        a["state"] == "resolved" for a in before["alerts"]
    ), before["alerts"]
    for name in before:
        diffs = [(a, b) for a, b in zip(before[name], after[name], strict=False) if a != b]
        detail = [{k: (a[k], b[k]) for k in a if a[k] != b.get(k)} | {"row": a} for a, b in diffs[:3]]
        assert before[name] == after[name], f"{name} differs for the good tenants ({len(diffs)} rows): {detail}"

    tripped = {k: v for k, v in metrics.items() if k.startswith("ttft_caps_tripped_total") and v > 0}
    letters = {
        r["reason_code"]: int(r["n"])
        for r in mixed.query(
            "SELECT reason_code, count() AS n FROM {db}.dead_letters FINAL "
            f"WHERE tenant_id = '{HOSTILE}' OR original LIKE '%{HOSTILE}%' GROUP BY reason_code"
        )
    }
    (own,) = mixed.query(
        "SELECT count() AS requests, sum(event_count) AS events, sum(duplicate_events) AS duplicates "
        f"FROM {{db}}.requests FINAL WHERE tenant_id = '{HOSTILE}'"
    )
    reused = mixed.query(
        f"SELECT count() AS n FROM {{db}}.requests FINAL WHERE tenant_id = '{HOSTILE}' "
        f"AND request_id IN (SELECT request_id FROM {{db}}.requests FINAL WHERE tenant_id IN ({GOOD_SQL}))"
    )[0]["n"]
    print(f"HOSTILE: {hostile_sent} events sent; own rows {own}; dead letters {letters}; caps tripped {tripped}")
    print(f"HOSTILE: {reused} of its requests reuse a good tenant's request id")
    for cap in ("watermark_step", "events_per_request", "open_requests_per_tenant", "tenant_quarantine"):
        assert tripped.get(f'ttft_caps_tripped_total{{cap="{cap}"}}', 0) > 0, (cap, tripped)
    for cap in ("custom_stages_per_tenant", "routes_per_tenant"):
        assert tripped.get(f'ttft_caps_tripped_total{{cap="{cap}"}}', 0) > 0, (cap, tripped)
    assert metrics.get("ttft_series_overflow_total", 0) > 0, "the hostile tenant's versions were not folded"
    for reason in ("timestamp_skew", "too_many_events", "conflicting_duplicate", "duplicate_key", "schema"):
        assert letters.get(reason, 0) > 0, (reason, letters)
    assert reused > 0
    assert hostile_sent >= 50_000
    # Each conflicting duplicate's losing copy is dead-lettered (and also counted in duplicate_events).
    accounted = int(own["events"]) + sum(letters.values())
    assert accounted == hostile_sent, f"{hostile_sent - accounted} hostile events unaccounted for"
