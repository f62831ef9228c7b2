"""Join-worker memory per open request: RSS before and after ``N`` requests are held open.

A join worker on its own prefix, with a request timeout of an hour so nothing is finalised, receives
``request_start`` events as a warm-up (half of ``N``, at least 20,000; the baseline is read after them),
then ``N`` more (shaped like the simulator's, with its attrs) and nothing else, in two halves with the RSS
read after each. The RSS delta over ``N`` is the cost of one open request in the worker: the core's
``PendingRequest``, its deadline entry and its share of the changelog writes. The second half's slope is
reported too.
"""

from __future__ import annotations

import time
from typing import Any

from bench.harness import BenchEnv, poll_until, produce
from bench.procstat import MIB, ProcSample, read_proc
from bench.traffic import Traffic, request_starts

#: Long enough that no open request times out or is evicted while the run holds them.
HOLD_MS = 3_600_000
#: Requests opened before the baseline is read, at least (they stay open; the figure is over the ``count``
#: after). The warm-up is as large as each measured half, so that the transient peak of reading one such
#: burst (fetch buffers, a fetch's decoded events, the state write) is reached before the baseline: with a
#: 20,000 warm-up the first 50,000 cost 39-80 MB in three runs of the same code (the second 50,000: 34.0 MB
#: in all three), and the per-request figure ranged 764-1,193 B.
MIN_WARM_UP = 20_000


def measure_open_requests(env: BenchEnv, traffic: Traffic, count: int, timeout_s: float = 240.0) -> dict[str, Any]:
    """RSS of a join worker holding ``count`` open requests, and the delta per request."""
    settings = env.settings("mem")
    env.create_topics(settings)
    pipe = env.pipeline(
        settings,
        TTFT_JOIN__REQUEST_TIMEOUT_MS=str(HOLD_MS),
        TTFT_JOIN__FORGET_AFTER_MS=str(HOLD_MS),
        TTFT_JOIN__MAX_OPEN_REQUESTS=str(max(count * 2, 200_000)),
        TTFT_JOIN__MAX_OPEN_REQUESTS_PER_TENANT=str(max(count * 2, 200_000)),
    )
    template = next(m for m in traffic.messages if b'"request_start"' in m[1])
    half = count // 2
    warm = max(MIN_WARM_UP, half)
    every = request_starts(template, warm + count, start_ms=time.time() * 1000.0)
    warm_up, messages = every[:warm], every[warm:]
    join = env.start_worker(pipe, "join")

    def hold(n: int) -> ProcSample:
        poll_until(
            lambda: join.metric("ttft_open_requests") >= n and join.metric("ttft_unacked_events") == 0,
            timeout_s,
            f"{n} open requests",
            interval_s=0.25,
        )
        time.sleep(1.0)
        return read_proc(join.proc.pid)

    try:
        # The baseline is a worker that has run: the first batches grow fetch and produce buffers, caches
        # and lazily built code paths once, whatever the number of requests (they are not per request).
        produce(settings, settings.topic("stage-events"), warm_up)
        before = hold(warm)
        produce(settings, settings.topic("stage-events"), messages[:half])
        middle = hold(warm + half)
        produce(settings, settings.topic("stage-events"), messages[half:])
        after = hold(warm + count)
        open_now = join.metric("ttft_open_requests")
        restart_s = _restart(env, pipe, join, settings, messages[-1], warm + count, timeout_s)
    finally:
        pipe.stop_all()
    delta = after.rss_bytes - before.rss_bytes
    return {
        "figures": {
            "open_requests": open_now,
            "rss_open_requests_mb": after.rss_bytes / MIB,
            "rss_per_open_request_bytes": delta / count,
            "restart_consume_s": restart_s,
        },
        "details": {
            "rss_before_mb": before.rss_bytes / MIB,
            "rss_half_mb": middle.rss_bytes / MIB,
            "rss_after_mb": after.rss_bytes / MIB,
            # The second half's slope leaves out one-off growth (fetch buffers, first allocations).
            "marginal_bytes_per_open_request": (after.rss_bytes - middle.rss_bytes) / (count - half),
            "peak_rss_mb": after.peak_rss_bytes / MIB,
        },
    }


def _restart(env: BenchEnv, pipe: Any, join: Any, settings: Any, one_more: Any, count: int, timeout_s: float) -> float:
    """Seconds from starting a replacement join worker (the old one stopped, ``count`` requests open in
    the changelog) until it has restored them all and consumed a new event."""
    pipe.stop(join)
    started = time.time()
    fresh = env.start_worker(pipe, "join")
    produce(settings, settings.topic("stage-events"), [one_more])
    done = poll_until(
        lambda: fresh.metric("ttft_open_requests") >= count and fresh.metric("ttft_events_consumed_total") >= 1,
        timeout_s,
        "the restarted join to restore and consume",
        interval_s=0.1,
    )
    return done - started
