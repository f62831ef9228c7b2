"""Simulator speed: events/s of :func:`streams.sim.generate` next to ``orjson.dumps`` of the same events.

The ratio says how much the latency model costs on top of serialising its output; both run in this
process, one after the other, on the same events.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from bench.traffic import SCENARIO
from streams.sim import generate


def measure_simspeed(events: int = 60_000, seed: int = 3) -> dict[str, float | None]:
    """Generate about ``events`` events, then dump the same event dicts again with orjson."""
    rate = 1_000.0
    duration_s = max(events / 7.9 / rate, 1.0)
    started = time.perf_counter()
    messages = list(generate(SCENARIO, rate_rps=rate, duration_s=duration_s, seed=seed, start_ms=1.7e12))
    sim_s = time.perf_counter() - started
    dicts: list[Any] = [orjson.loads(v) for _, v, _ in messages]
    dumps = orjson.dumps
    best = float("inf")
    for _ in range(3):  # best of three: the dump is short and the machine is shared
        t = time.perf_counter()
        for d in dicts:
            dumps(d)
        best = min(best, time.perf_counter() - t)
    n = len(messages)
    return {"sim_events_per_s": n / sim_s, "orjson_dump_events_per_s": n / best}
