"""Micro-benchmark of the store writer's own per-batch work, without Kafka (``python -m bench.writercore``).

The records are the join's real output for ``build_traffic(N)`` (folded by the pure join, serialised with
``orjson.dumps`` as the batch adapter does). They are fed to :meth:`streams.app.writer.StoreWriter._process`
in batches of ``--batch`` messages, against a fresh chDB store, with the live writer's window closer
hooked in (closes run in its close process, as in the worker; this process's CPU is what is reported).
Reported: ``time.process_time()`` (every thread of this process, chDB's included) per stage event and per
record, for the whole pass and for the requests insert alone.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import ConsumerRecord, TopicPartition

from bench.traffic import build_traffic
from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.app.writer import StoreWriter
from streams.core.join import RequestJoin
from streams.core.tenancy import TenantBudgets
from streams.settings import Settings
from streams.store.client import make_client
from streams.store.migrate import apply_migrations

TOPIC = "ttft.stage-events"


def joined_records(events: int, settings: Settings) -> tuple[int, list[tuple[bytes, bytes]]]:
    """(stage events, [(key, record bytes)]) of the join over ``build_traffic(events)``."""
    messages = build_traffic(events).messages
    core = RequestJoin(settings.join, settings.windows.window_s * 1000, TenantBudgets.from_settings(settings))
    now = time.time() * 1000.0
    out: list[tuple[bytes, bytes]] = []
    for i, (key, value, ts) in enumerate(messages):
        decoded = decode_stage_event(value, key, TOPIC, 0, i, int(ts), settings.caps, now, append_time_ms=None)
        if isinstance(decoded, DeadLetter):
            continue
        out += [(key, orjson.dumps(r)) for r in core.add(decoded, 0, now, offset=i) if isinstance(r, dict)]
    out += [(str(r["request_id"]).encode(), orjson.dumps(r)) for r in core.advance(0, now, True)]
    return len(messages), out


class _Consumer:
    """What ``_process`` asks of the aiokafka consumer after the insert."""

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        return None

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def assignment(self) -> set[TopicPartition]:
        return set()

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return None


def _timed_store(writer: StoreWriter, totals: dict[str, float]) -> None:
    """Count the process CPU spent while the writer waits on its store thread (the event loop is idle)."""
    in_store = writer._in_store

    async def timed(fn: Callable[..., Any], *args: Any) -> Any:
        started = time.process_time()
        try:
            return await in_store(fn, *args)
        finally:
            totals["store calls"] = totals.get("store calls", 0.0) + time.process_time() - started

    writer._in_store = timed  # type: ignore[method-assign]


async def run_pass(records: list[tuple[bytes, bytes]], batch: int, home: Path, database: str) -> dict[str, float]:
    """CPU seconds of one pass: everything, and the store calls'."""
    settings = Settings(home=home, clickhouse_database=database)
    metrics = WorkerMetrics("writer", "bench")
    writer = StoreWriter(settings, metrics, stats_interval_s=None)
    writer.client = make_client(settings)
    apply_migrations(writer.client, database)
    writer.consumer = _Consumer()  # type: ignore[assignment]
    closer = WindowCloser(settings, metrics, writer.store_call, _no_publish, background=True)

    async def on_batch(recs: list[dict[str, Any]]) -> None:
        await closer.on_records(recs, polled_s=0.0, serialised=writer.batch_values)

    writer.hooks.append(on_batch)
    totals: dict[str, float] = {}
    _timed_store(writer, totals)
    gc_started: list[float] = []

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started.append(time.process_time())
        elif gc_started:
            totals["gc"] = totals.get("gc", 0.0) + time.process_time() - gc_started.pop()

    gc.callbacks.append(gc_timer)
    tp = TopicPartition(settings.topic("requests"), 0)
    messages = [
        ConsumerRecord(tp.topic, 0, offset, 0, 0, key, value, None, len(key), len(value), [])
        for offset, (key, value) in enumerate(records)
    ]
    started = time.process_time()
    for i in range(0, len(messages), batch):
        await writer._process({tp: messages[i : i + batch]})
    totals["total"] = time.process_time() - started
    gc.callbacks.remove(gc_timer)
    await closer.stop()
    writer.executor.shutdown(wait=True)
    return totals


async def _no_publish(topic: str, key: bytes, value: bytes) -> None:
    return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1_000, help="messages per writer batch")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="print a cProfile of one pass")
    p.add_argument("--gc-freeze", action="store_true", help="gc.freeze() before the runs")
    p.add_argument("--gc-threshold", type=int, nargs=3, help="gc.set_threshold() before the runs")
    args = p.parse_args(argv)
    if args.gc_threshold:
        gc.set_threshold(*args.gc_threshold)
    events, records = joined_records(args.events, Settings())
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    passes = []
    # chDB holds one data directory per process: each pass gets its own database in it.
    with tempfile.TemporaryDirectory(prefix="writercore-") as home:
        for i in range(args.repeat):
            if args.profile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.runcall(asyncio.run, run_pass(records, args.batch, Path(home), f"bench{i}"))
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                return
            passes.append(asyncio.run(run_pass(records, args.batch, Path(home), f"bench{i}")))
    best = min(passes, key=lambda t: t["total"])
    print(
        json.dumps(
            {
                "events": events,
                "records": len(records),
                "batch": args.batch,
                "us_per_event_best": round(best["total"] / events * 1e6, 2),
                "us_per_event_all": [round(t["total"] / events * 1e6, 2) for t in passes],
                "us_per_record_best": round(best["total"] / len(records) * 1e6, 1),
                "store_calls_us_per_record": round(best.get("store calls", 0.0) / len(records) * 1e6, 1),
                "gc_us_per_record": round(best.get("gc", 0.0) / len(records) * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
