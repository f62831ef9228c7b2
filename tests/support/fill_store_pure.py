"""Fill a chDB store with simulated traffic through the pure core, without Kafka or workers (for dev).

    TTFT_HOME=/tmp/x python tests/support/fill_store_pure.py --minutes 20 --rate 20 --end-ago-min 30

Simulated events (``streams.sim``, with faults) -> ``decode_stage_event`` -> ``RequestJoin`` ->
``insert_requests``; windows -> ``aggregate_windows`` -> ``insert_window_aggregates``; the rule engine over
the windows -> ``canary_verdicts`` and ``alerts``; dead letters; and synthetic ``pipeline_stats`` samples.
Prints one JSON line: the event time range (ms) and row counts. The panel tests use the real pipeline
(``tests/fixtures/pipeline_run.py``); this script only makes a store to develop dashboards against.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from typing import Any

from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from streams.core.join import Refusal, RequestJoin, TenantMismatch
from streams.core.windows import aggregate_window
from streams.rules.engine import RuleEngine
from streams.rules.model import WindowSnapshot
from streams.settings import Settings, load_settings
from streams.sim import ErrorRates, generate
from streams.store.aggregates_store import insert_window_aggregates
from streams.store.client import make_client
from streams.store.dead_letter_store import insert_dead_letters
from streams.store.migrate import apply_migrations
from streams.store.requests_store import insert_requests
from streams.store.shutdown import exit_process
from streams.store.stats_store import insert_stats, stat_sample

TOPIC = "ttft.stage-events"


def join_traffic(
    settings: Settings, messages: list[tuple[bytes, bytes, float]]
) -> tuple[list[dict[str, Any]], list[DeadLetter]]:
    join = RequestJoin(settings.join, settings.windows.window_s * 1000)
    records: list[dict[str, Any]] = []
    letters: list[DeadLetter] = []
    for offset, (key, value, ts) in enumerate(messages):
        decoded = decode_stage_event(value, key, TOPIC, 0, offset, int(ts), settings.caps, ts)
        if isinstance(decoded, DeadLetter):
            letters.append(decoded)
            continue
        for out in join.add(decoded, 0, ts, offset):
            if isinstance(out, TenantMismatch | Refusal):
                continue
            records.append(out)
        if offset % 500 == 0:
            records.extend(join.advance(0, ts))
    last = messages[-1][2] if messages else 0.0
    records.extend(join.advance(0, last + 1.0))
    records.extend(join.advance(0, last + 10 * settings.join.request_timeout_ms))
    return [r for r in records if not r.get("amend")], letters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", default="canary-regression")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--end-ago-min", type=float, default=30.0, help="Traffic ends this long before now.")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    settings = load_settings()
    client = make_client(settings)
    summary = fill(
        client,
        settings.clickhouse_database,
        settings,
        scenario=args.scenario,
        minutes=args.minutes,
        rate=args.rate,
        end_ago_min=args.end_ago_min,
        seed=args.seed,
    )
    print(json.dumps(summary))


def fill(
    client: Any,
    db: str,
    settings: Settings,
    *,
    scenario: str = "canary-regression",
    minutes: float = 20.0,
    rate: float = 20.0,
    end_ago_min: float = 30.0,
    seed: int = 3,
) -> dict[str, Any]:
    """Fill database ``db`` (migrated here) with ``minutes`` of simulated traffic ending ``end_ago_min`` ago;
    returns the event time range (ms) and row counts."""
    apply_migrations(client, db)
    window_ms = settings.windows.window_s * 1000
    start_ms = float((int(time.time() * 1000 - (end_ago_min + minutes) * 60_000) // window_ms) * window_ms)
    errors = ErrorRates(duplicate=0.02, missing_stage=0.02, orphan=0.01, malformed=0.003)
    messages = list(
        generate(
            scenario,
            rate_rps=rate,
            duration_s=minutes * 60,
            seed=seed,
            start_ms=start_ms,
            errors=errors,
        )
    )
    records, letters = join_traffic(settings, messages)
    insert_requests(client, db, records)
    insert_dead_letters(client, db, letters)

    by_window: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_window[int(record["window_start"])].append(record)
    dead: dict[int, Counter[str]] = defaultdict(Counter)
    for letter in letters:
        ts = letter.kafka_timestamp or 0
        dead[int(ts // window_ms) * window_ms][letter.tenant_id or "unknown"] += 1
    engine = RuleEngine(rules_config(settings), settings)
    verdicts: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    first, last = min(by_window), max(by_window)
    for ws in range(first, last + window_ms, window_ms):
        aggs = aggregate_window(by_window.get(ws, []), ws, settings, dead_letters=dict(dead.get(ws, {})))
        insert_window_aggregates(
            client,
            db,
            {
                "stage_windows": aggs.stage_windows,
                "stage_strata": aggs.stage_strata,
                "tail_attribution": aggs.tail_attribution,
                "window_health": aggs.window_health,
                "llm_signals": aggs.llm_signals,
            },
        )
        arms = {
            (str(r["tenant_id"]), str(r["version_id"])): str(r["rollout"])
            for r in by_window.get(ws, [])
            if r.get("rollout") in ("stable", "canary")
        }
        snap = WindowSnapshot(aggs.stage_windows, aggs.stage_strata, aggs.window_health, aggs.llm_signals, arms)
        out = engine.evaluate_window(ws, snap)  # type: ignore[arg-type]
        verdicts += [v.to_row() for v in out.verdicts]
        alerts += [t.to_row() for t in out.transitions]
        evaluations += [e.to_row() for e in out.evaluations]
    for table, rows in (("canary_verdicts", verdicts), ("alerts", alerts), ("rule_evaluations", evaluations)):
        if rows:
            cols = list(rows[0])
            client.insert(table, [[r[c] for c in cols] for r in rows], column_names=cols, database=db)

    samples = []
    for i, ts in enumerate(range(int(start_ms), int(messages[-1][2]), 15_000)):
        for worker in ("join-1", "writer-1"):
            samples += [
                stat_sample(ts, worker, worker[:-2], "consumer_lag", (i * 37) % 500, {"partition": "0"}),
                stat_sample(ts, worker, worker[:-2], "open_requests", 100 + i % 50),
                stat_sample(ts, worker, worker[:-2], "evictions", i // 40),
                stat_sample(ts, worker, worker[:-2], "series_cap_hits", 0),
                stat_sample(ts, worker, worker[:-2], "insert_latency_ms", 5 + i % 7, {"table": "requests"}),
            ]
    insert_stats(client, db, samples)
    return {
        "time_range_ms": [start_ms, messages[-1][2]],
        "records": len(records),
        "dead_letters": len(letters),
        "verdicts": len(verdicts),
        "alerts": len(alerts),
        "windows": len(by_window),
    }


def rules_config(settings: Settings) -> Any:
    from streams.grafana.build import rules_config as build_rules

    return build_rules(settings)


if __name__ == "__main__":
    main()
    exit_process(0)
