"""Issues 14 and 27: hostile input changes nothing for the good tenants (real broker, join, OTLP bridge
and writer).

Three well-behaved tenants' seeded traffic (one of them regresses, so an alert fires) runs through two
pipelines side by side on one broker, each with its own topics and store: alone, and mixed with
- issue 14's hostile tenant, in every window doing all of that issue's items 2, 3, 4, 5, 7 and 8 at once
  (>= 50,000 events);
- issue 27's attacks (tests/support/hostile_mix.py): OTLP spans with NaN, Infinity and 2^64 times and a
  trace holding 300 spans of 4 KB attributes, 20,000 sprayed tenant ids, 2,000 unparseable messages on
  one partition, and a tenant whose events are 14 minutes old when they arrive.
The traffic is a backlog of eleven minutes and a live tail (each message sent when the clock reaches
it). For the good tenants, ``requests FINAL``, ``stage_windows``, ``window_health`` and the alert
transitions must be identical between the runs; their windows close within grace + 5 s of the run without
the attacks; no worker restarts; every bound trips; every hostile event is in its own rows or in
``dead_letters``.

Ingestion bookkeeping left out of the comparison: ``inserted_at`` (wall time of the insert),
``computed_version`` (wall-time version of a window computation), ``window_health.amendments`` (how
often the whole window was recomputed after it closed), and how a request's events arrived relative to
its first record: ``requests.late_events``, ``requests.record_version`` (one more per re-emission) and
``window_health.late_events``. The idle tick moves a caught-up tenant's clock on by wall time after
``join.idle_tick_ms`` of silence (5 s here), so when the test's producer stalls longer than that on a loaded
host, the idle alone run emits a request before its last event and re-emits it with it (the stored values
the same), while the busy mixed run does not: CI, twice on 2026-12-07 (7 requests, then 2, late by one event).
Every measured column is still compared.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from streams.kafka.topics import ensure_topics
from streams.settings import Settings, load_settings
from tests.support import hostile_mix
from tests.support.isolation_traffic import GOOD, GRACE_S, HOSTILE, LIVE_TAIL_S, config_27, isolation_inputs
from tests.support.join_cpu import create_topic, proc_cpu_s
from tests.support.scenarios import PipelinePair, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(600)]

GOOD_SQL = ", ".join(f"'{t}'" for t in GOOD)


def _settings(bootstrap: str, home: Path) -> Settings:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = load_settings(kafka_bootstrap=bootstrap, home=home, topic_prefix=prefix, app_id=prefix)
    asyncio.run(ensure_topics(settings))
    return settings


def _tables(pair: PipelinePair) -> dict[str, list[dict[str, Any]]]:
    where = f"WHERE tenant_id IN ({GOOD_SQL})"
    return {
        "requests": pair.query(
            f"SELECT * EXCEPT (inserted_at, late_events, record_version) FROM {{db}}.requests FINAL {where} "
            "ORDER BY tenant_id, request_id"
        ),
        "stage_windows": pair.query(
            f"SELECT * EXCEPT (computed_version) FROM {{db}}.stage_windows FINAL {where} "
            "ORDER BY tenant_id, version_id, stage, window_start"
        ),
        "window_health": pair.query(
            f"SELECT * EXCEPT (computed_version, late_events) FROM {{db}}.window_health FINAL {where} "
            "ORDER BY tenant_id, version_id, window_start"
        ),
        "alerts": pair.query(
            "SELECT fingerprint, alertname, tenant_id, stage, state, event_at FROM {db}.alerts FINAL "
            f"{where} AND alertname != 'Watchdog' ORDER BY fingerprint, event_at, state"
        ),
    }


# --- issue 27: the hostile mix, live ------------------------------------------------------------------------


class _Sampler:
    """Every half second, per run: the join's CPU seconds, events consumed, the writer's event time, its queued
    window closes, and the join's events acked (their outputs and state written, offsets committed)."""

    def __init__(self, pairs: dict[str, PipelinePair]) -> None:
        self.pairs = pairs
        self.samples: dict[str, list[tuple[float, float, float, float, float, float]]] = {name: [] for name in pairs}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for name, pair in self.pairs.items():
                try:
                    cpu = proc_cpu_s(pair.join.proc.pid)
                    join = pair.join.metrics()  # one scrape of the join per sample (it costs the join CPU)
                    consumed = join.get("ttft_events_consumed_total", 0.0)
                    acked = join.get("ttft_events_acked_total", 0.0)
                    writer = pair.writer.metrics()
                except (OSError, ValueError):
                    continue
                watermark = writer.get("ttft_writer_watermark_ms", 0.0)
                queued = writer.get("ttft_window_jobs_queued", 0.0)
                self.samples[name].append((time.time() * 1000.0, cpu, consumed, watermark, queued, acked))
            self.stop.wait(0.5)

    def cpu_per_event_us(self, name: str, backlog: int) -> tuple[float, float]:
        """CPU µs per event while the join worked through its backlog, and when it was through (ms): from the
        sample before its first event was consumed to the first with every backlog event acked, so that the last
        fetch's outputs, state and commit count too (its consumed count moves before they are done: ending there
        left out up to one fetch's completion, 10,000 events' outputs, more for the mixed runs than the others)."""
        rows = self.samples[name]
        first = next(r for r in rows if r[2] > 0)
        base = rows[max(0, rows.index(first) - 1)]
        done = next((r for r in rows if r[5] >= backlog), rows[-1])
        return (done[1] - base[1]) * 1e6 / max(1.0, done[2] - base[2]), done[0]

    def caught_up_ms(self, name: str, joined_ms: float) -> float:
        """When the writer, its join through the backlog, had no window close queued and its event time was
        within a minute of the clock: every backlog window closed."""
        return next(
            (t for t, _, _, wm, queued, _ in self.samples[name] if t >= joined_ms and not queued and t - wm < 60_000),
            float("inf"),
        )


def test_issue27_hostile_mix_changes_nothing_for_the_good_tenants(kafka_broker: Any, tmp_path: Path) -> None:
    """Issue 27's done-when: both runs side by side on one broker, over the same good traffic (whose last
    ``LIVE_TAIL_S`` arrive live); the mixed run also gets issue 14's hostile tenant, OTLP spans with NaN,
    Infinity and 2^64 times and 300 held 4 KB spans, 20,000 sprayed tenant ids, 2,000 unparseable messages
    on one partition and a tenant 14 minutes late."""
    kafka_broker.ensure_running()
    inputs = isolation_inputs(time.time() * 1000.0)
    attacks, hostile_sent = inputs.attacks, inputs.hostile_sent
    sends = {"alone": inputs.good, "mixed": inputs.mixed}
    if os.environ.get("TTFT_ISOLATION_ISSUE14_RUN") == "1":  # the test as issue 14 left it: without the attacks
        sends["issue14"] = inputs.issue14
    if os.environ.get("TTFT_ISOLATION_HOSTILE_ONLY") == "1":  # a third pipeline: the hostile input alone
        sends["hostile"] = inputs.hostile()
    if os.environ.get("TTFT_ISOLATION_ATTACKS_RUN") == "1":  # the good traffic with this issue's attacks only
        sends["attacks"] = inputs.good + attacks
    runs: dict[str, PipelinePair] = {}
    topics: dict[str, dict[str, str]] = {}
    try:
        for name in sends:
            home = tmp_path / name
            home.mkdir()
            settings = _settings(kafka_broker.bootstrap, home)
            otlp = f"{settings.topic_prefix}-otlp_spans"
            asyncio.run(create_topic(settings, otlp))
            config = write_config(home / "ttft.yaml", config_27(settings.topic_prefix))
            topics[name] = {"stage-events": settings.topic("stage-events"), "otlp": otlp}
            runs[name] = PipelinePair.start(settings, home, TTFT_CONFIG=str(config))
        pids = {name: (p.join.proc.pid, p.writer.proc.pid) for name, p in runs.items()}
        profiles = _start_profiles(runs)
        sampler = _Sampler(runs)
        sampler.thread.start()
        time.sleep(2.0)
        producer = hostile_mix.PacedProducer(
            kafka_broker.bootstrap, {name: (topics[name], messages) for name, messages in sends.items()}
        )
        producer.send_backlog()
        producer.start()
        _stop_profiles(
            profiles,
            runs,
            until=lambda: all(runs[n].join.metric("ttft_events_consumed_total") >= producer.backlog[n] for n in runs),
        )
        producer.join(timeout=LIVE_TAIL_S + 150)
        live_end_ms = time.time() * 1000.0
        for pair in runs.values():
            pair.wait_drained(240)
        sampler.stop.set()
        sampler.thread.join(5)
        otlp_consumed = runs["mixed"].join.metric("ttft_otlp_messages_total")
        metrics = runs["mixed"].writer.metrics()
        for name, value in runs["mixed"].join.metrics().items():
            metrics[name] = metrics.get(name, 0.0) + value
        for name, pair in runs.items():
            assert pair.join.alive() and pair.writer.alive(), f"a worker of the {name} run exited"
            assert (pair.join.proc.pid, pair.writer.proc.pid) == pids[name]
            pair.stop()
    finally:
        for pair in runs.values():
            pair.pipe.stop_all()

    # 1. The good tenants' rows are the same. Left out besides the ingestion bookkeeping of ``_tables``:
    # ``window_health.amendments``, how often the whole window was recomputed after it closed (every
    # tenant's row of it is rewritten, with the same numbers, when any tenant's late record amends it).
    before, after = _tables(runs["alone"]), _tables(runs["mixed"])
    for rows in (before["window_health"], after["window_health"]):
        for row in rows:
            row.pop("amendments")
    late = runs["mixed"].query(
        "SELECT tenant_id, window_start, sum(late_amendments) AS late, max(amendments) AS recomputed "
        "FROM {db}.window_health FINAL WHERE late_amendments > 0 AND tenant_id NOT LIKE 'spray-%' "
        "GROUP BY tenant_id, window_start ORDER BY window_start, tenant_id"
    )
    print("MIXED: late amendments by tenant and window:", late[-12:])
    print("GOOD TENANTS' ROWS (alone, mixed):", {n: (len(before[n]), len(after[n])) for n in before})
    late_sql = f"SELECT sum(late_events) AS late FROM {{db}}.requests FINAL WHERE tenant_id IN ({GOOD_SQL})"
    print("GOOD TENANTS' LATE EVENTS (alone, mixed):", [int(p.query(late_sql)[0]["late"]) for p in runs.values()])
    assert any(a["state"] == "firing" for a in before["alerts"]), before["alerts"]
    for name in before:
        diffs = [(a, b) for a, b in zip(before[name], after[name], strict=False) if a != b]
        detail = [{k: (a[k], b[k]) for k in a if a[k] != b.get(k)} | {"row": a} for a, b in diffs[:3]]
        assert before[name] == after[name], f"{name} differs for the good tenants ({len(diffs)} rows): {detail}"

    # 2. Their windows close on time: the writers' event time, side by side once both writers closed every
    # backlog window (how much later the mixed one got there is printed, not judged: a backlog is work).
    cpu = {n: sampler.cpu_per_event_us(n, producer.backlog[n]) for n in runs}
    caught = {n: sampler.caught_up_ms(n, cpu[n][1]) for n in ("alone", "mixed")}
    (tmp_path / "samples.json").write_text(json.dumps({"samples": sampler.samples, "live_end_ms": live_end_ms}))
    live_from = max(caught.values())
    alone = {round(r[0] / 500): r[3] for r in sampler.samples["alone"] if live_from <= r[0] <= live_end_ms}
    behind = sorted(
        (alone[round(r[0] / 500)] - r[3]) / 1000 for r in sampler.samples["mixed"] if round(r[0] / 500) in alone
    )
    through = {n: (caught[n] - sampler.samples[n][0][0]) / 1000 for n in caught}
    print(
        "WRITERS THROUGH THE BACKLOG (s after the traffic began):",
        {n: round(v) for n, v in through.items()},
    )
    assert len(behind) >= 20, f"only {len(behind)} live samples (the writers took long to close the backlog)"
    p90 = behind[int(0.9 * (len(behind) - 1))]
    print(
        f"MIXED WRITER'S EVENT TIME BEHIND THE ALONE ONE (s): median {behind[len(behind) // 2]:.1f}, "
        f"p90 {p90:.1f}, max {behind[-1]:.1f} over {len(behind)} live samples"
    )
    assert p90 <= GRACE_S + 5, behind

    # 3. The join's CPU per event. Printed against the good traffic alone (and, with
    # TTFT_ISOLATION_ISSUE14_RUN=1, against issue 14's mixed run, the run without this issue's attacks);
    # bounded at 4x the good traffic's (no scan over 20,000 tenants per event). Here the pipelines share the
    # host's two cores with each other and the paced producer, which moves a join's CPU per event by more
    # than 20 % from run to run: issue 27's 20 % is asserted by test_join_cpu_isolation.py, one join at a time.
    line = f"alone {cpu['alone'][0]:.1f} ({producer.backlog['alone']} messages)"
    if "issue14" in cpu:
        line += f", issue 14's mixed run {cpu['issue14'][0]:.1f} ({producer.backlog['issue14']})"
    line += f", mixed {cpu['mixed'][0]:.1f} ({producer.backlog['mixed']}); mixed / alone "
    line += f"{cpu['mixed'][0] / cpu['alone'][0]:.2f}"
    if "issue14" in cpu:
        line += f", mixed / issue 14's {cpu['mixed'][0] / cpu['issue14'][0]:.2f}"
    print(f"JOIN CPU PER EVENT (µs) through the backlog: {line}")
    if "attacks" in cpu:  # issue 27's third reading: its attacks mixed into the good traffic, without issue 14's
        print(
            f"JOIN CPU PER EVENT (µs), the good traffic with this issue's attacks only: {cpu['attacks'][0]:.1f} "
            f"({producer.backlog['attacks']} messages); attacks / alone {cpu['attacks'][0] / cpu['alone'][0]:.2f}"
        )
    if "hostile" in cpu:  # what the mixed run's CPU would be if the two inputs cost what they cost apart
        apart = cpu["alone"][0] * producer.backlog["alone"] + cpu["hostile"][0] * producer.backlog["hostile"]
        print(
            f"JOIN CPU PER EVENT (µs), the hostile input alone: {cpu['hostile'][0]:.1f} "
            f"({producer.backlog['hostile']} messages); mixed / (alone + hostile, apart): "
            f"{cpu['mixed'][0] * producer.backlog['mixed'] / apart:.2f}"
        )
    assert cpu["mixed"][0] <= 4.0 * cpu["alone"][0], cpu

    # 4. Every attack landed where it belongs, and nothing was lost.
    mixed = runs["mixed"]
    letters = {
        r["reason_code"]: int(r["n"])
        for r in mixed.query("SELECT reason_code, count() AS n FROM {db}.dead_letters FINAL GROUP BY reason_code")
    }
    (counts,) = mixed.query(
        "SELECT countIf(tenant_id LIKE 'spray-%') AS sprayed, countIf(tenant_id = 'laggard') AS lagging, "
        "countIf(tenant_id = 'eve') AS eve FROM {db}.requests FINAL"
    )
    mark = hostile_mix.GARBAGE_MARK.decode()
    (garbage,) = mixed.query(f"SELECT count() AS n FROM {{db}}.dead_letters FINAL WHERE original LIKE '%{mark}%'")
    tripped = {k: v for k, v in metrics.items() if k.startswith("ttft_caps_tripped_total") and v > 0}
    print(
        f"MIXED: dead letters {letters}; rows {counts}; garbage letters {garbage}; otlp messages "
        f"{otlp_consumed:.0f}; caps tripped {tripped}"
    )
    n_lag = sum(1 for m in attacks if m.key and m.key.startswith(b"lag-")) // 5
    assert int(counts["sprayed"]) == 20_000
    assert int(counts["lagging"]) == n_lag
    assert int(garbage["n"]) == 2_000
    assert otlp_consumed >= sum(1 for m in attacks if m.role == "otlp")
    assert letters.get("too_large", 0) > 0 and letters.get("schema", 0) > 0
    assert tripped.get('ttft_caps_tripped_total{cap="producer_quarantine"}', 0) > 0, tripped
    _check_issue14_hostile(mixed, metrics, hostile_sent)


def _check_issue14_hostile(mixed: PipelinePair, metrics: dict[str, float], hostile_sent: int) -> None:
    """Issue 14's hostile tenant: every bound tripped, every event in its own rows or in dead letters."""
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
    print(f"HOSTILE: {hostile_sent} events sent; own rows {own}; dead letters {letters}; {reused} reuse good ids")
    # Events 24 h (5 a window) and 12 minutes (40, in the live tail) ahead of the clock are refused when
    # read; the watermark bounds they tripped in a backlog (issue 14) have their unit tests.
    assert letters.get("timestamp_skew") == 5 * 13 + 40, letters
    for cap in ("events_per_request", "open_requests_per_tenant", "tenant_quarantine"):
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


def _start_profiles(runs: dict[str, PipelinePair]) -> dict[str, Any]:
    """``TTFT_ISOLATION_PROFILE=DIR``: py-spy on each run's join through its backlog; top frames in DIR."""
    out = os.environ.get("TTFT_ISOLATION_PROFILE")
    if not out:
        return {}
    from bench.profiling import start_pyspy

    Path(out).mkdir(parents=True, exist_ok=True)
    return {n: start_pyspy(p.join.proc.pid, Path(out) / f"join-{n}.txt") for n, p in runs.items()}


def _stop_profiles(profiles: dict[str, Any], runs: dict[str, PipelinePair], until: Any) -> None:
    if not profiles:
        return
    from bench.profiling import parse_collapsed, stop_pyspy, top_frames

    runs["mixed"].pipe.wait_for(until, 300, "both joins through their backlog")
    out = Path(os.environ["TTFT_ISOLATION_PROFILE"])
    for name, proc in profiles.items():
        stop_pyspy(proc)
        stacks = parse_collapsed((out / f"join-{name}.txt").read_text())
        lines = [f"{f.self_pct:5.1f} {f.total_pct:5.1f} {f.frame}" for f in top_frames(stacks, 40)]
        (out / f"join-{name}-top.txt").write_text("\n".join(lines) + "\n")
