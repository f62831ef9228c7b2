"""Micro-benchmark of the join worker's own per-event work, without Kafka (``python -m bench.joincore``).

CPU: every message of ``build_traffic(N)`` is decoded (:func:`schemas.decode.decode_stage_event`) and folded
(:meth:`streams.core.join.RequestJoin.add`), each emitted record serialised with ``orjson.dumps`` (as the
batch adapter does); every 5,000 events the partition is advanced and the dirty states packed, as a batch
flush would. Reported: ``time.process_time()`` per event, best of ``--repeat`` runs.

Memory: a fresh process folds ``--open`` ``request_start`` events shaped like the simulator's
(:func:`bench.traffic.request_starts`), flushing the dirty states every 5,000 like the worker; the RSS
delta (and the tracemalloc delta, in a second process) over the open requests is the cost of one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import orjson

from bench.traffic import build_traffic, request_starts
from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from streams.core.join import RequestJoin
from streams.core.tenancy import TenantBudgets
from streams.settings import Settings

TOPIC = "ttft.stage-events"
FLUSH_EVERY = 5_000


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_cpu(messages: list[Any], settings: Settings) -> tuple[float, int]:
    """Seconds of CPU for one pass over ``messages``, and the bytes of records emitted."""
    caps = settings.caps
    # The worker's tenant budgets (registration on by default: streams.core.tenancy).
    core = RequestJoin(settings.join, settings.windows.window_s * 1000, TenantBudgets.from_settings(settings))
    now = time.time() * 1000.0
    emitted = 0
    dumps = orjson.dumps
    started = time.process_time()
    for i, (key, value, ts) in enumerate(messages):
        decoded = decode_stage_event(value, key, TOPIC, 0, i, ts, caps, now, append_time_ms=None)
        if isinstance(decoded, DeadLetter):
            emitted += len(decoded.model_dump_json())
            continue
        for out in core.add(decoded, 0, now, offset=i):
            if isinstance(out, dict):
                emitted += len(dumps(out))
        if i % FLUSH_EVERY == 0:
            for record in core.advance(0, now, False):
                emitted += len(dumps(record))
            for _, packed in core.dirty().values():
                emitted += len(packed or b"")
    for record in core.advance(0, now, False):
        emitted += len(dumps(record))
    for _, packed in core.dirty().values():
        emitted += len(packed or b"")
    return time.process_time() - started, emitted


def run_memory(count: int, mode: str) -> dict[str, Any]:
    """Hold ``count`` open requests in this process; the RSS (``mode`` rss) or traced (tracemalloc) delta."""
    settings = Settings()
    join = settings.join.model_copy(
        update={
            "request_timeout_ms": 3_600_000,
            "forget_after_ms": 3_600_000,
            "max_open_requests": 2 * count,
            "max_open_requests_per_tenant": 2 * count,
        }
    )
    traffic = build_traffic(2_000)
    template = next(m for m in traffic.messages if b'"request_start"' in m[1])
    messages = request_starts(template, count, start_ms=time.time() * 1000.0)
    caps = settings.caps
    core = RequestJoin(join, settings.windows.window_s * 1000, TenantBudgets.from_settings(settings))
    now = time.time() * 1000.0
    # Warm up: one request folded and flushed, so first-use allocations are not counted.
    warm = decode_stage_event(messages[0][1], messages[0][0], TOPIC, 0, 0, messages[0][2], caps, now)
    assert not isinstance(warm, DeadLetter)
    core.add(warm, 0, now, offset=0)
    core.dirty()
    gc.collect()
    if mode == "tracemalloc":
        import tracemalloc

        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if mode == "tracemalloc" else _rss_bytes()
    for i, (key, value, ts) in enumerate(messages[1:], start=1):
        decoded = decode_stage_event(value, key, TOPIC, 0, i, ts, caps, now)
        assert not isinstance(decoded, DeadLetter)
        core.add(decoded, 0, now, offset=i)
        if i % FLUSH_EVERY == 0:
            core.dirty()
    core.dirty()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if mode == "tracemalloc" else _rss_bytes()
    assert core.open_requests == count, core.open_requests
    return {"mode": mode, "open": count - 1, "bytes_per_open_request": (after - before) / (count - 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--open", type=int, default=100_000, help="open requests of the memory measurement (0: skip)")
    p.add_argument("--gc-freeze", action="store_true", help="the worker's gc.freeze() and thresholds first")
    p.add_argument("--profile", action="store_true", help="print a cProfile of one pass")
    p.add_argument("--memory-only", choices=("rss", "tracemalloc"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_only:
        print(json.dumps(run_memory(args.open, args.memory_only)))
        return
    settings = Settings()
    messages = build_traffic(args.events).messages
    if args.gc_freeze:  # as the join worker does after start-up (streams/app/runner.py)
        from streams.app.runner import tune_collector

        tune_collector()
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(run_cpu, messages, settings)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    runs = [run_cpu(messages, settings) for _ in range(args.repeat)]
    best = min(s for s, _ in runs)
    result: dict[str, Any] = {
        "events": len(messages),
        "us_per_event_best": round(best / len(messages) * 1e6, 2),
        "us_per_event_all": [round(s / len(messages) * 1e6, 2) for s, _ in runs],
        "output_bytes": runs[0][1],
    }
    if args.open:
        for mode in ("rss", "tracemalloc"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.joincore", "--open", str(args.open), "--memory-only", mode],
                check=True,
                capture_output=True,
                text=True,
            )
            result[f"{mode}_bytes_per_open_request"] = round(json.loads(out.stdout)["bytes_per_open_request"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
