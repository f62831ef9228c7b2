"""Lag: produce -> request row visible, at a steady offered load, on the running pipeline session.

Method (conservative, every error makes the lag look larger):

* produced: live simulator traffic paced to the wall clock at ``rate`` events/s; a request is "produced"
  at the scheduled wall time of its *last* event (the row cannot be complete before it). The paced
  producer flushes its batches before every wait, so a message leaves within a few ms of that time.
* visible: the writer commits a ``<prefix>.requests`` offset only after the rows of that batch were
  inserted, so a record is visible no later than the first time the writer group's committed offset on
  its partition is past it. The committed offsets are polled every 50 ms; the poll's wall time after the
  answer is used. Records are tied to request ids by reading the topic's keys afterwards.

The join grace (``join.grace_ms``) is part of the lag by design: a request is emitted once the event-time
watermark passes its first token + grace.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import time
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import TopicPartition

from bench.harness import Offsets, read_keys
from bench.pipeline import PipelineSession
from bench.traffic import EVENTS_PER_REQUEST, SCENARIO
from streams.kafka.topics import kafka_client_kwargs
from streams.sim import generate
from streams.sim.produce import Pacer, produce_messages

#: (wall time of the poll, {partition: committed offset})
CommitSample = tuple[float, dict[int, int]]


class WallPacer(Pacer):
    """Event time -> wall time at 1x, with the wall origin (``time.time()``) kept for the lag maths.

    ``at_event_time``: event time *is* wall time (the origin is ``start_ms`` itself), as with live
    services; the first message waits for it. Otherwise the origin is the first call's wall time."""

    def __init__(self, start_ms: float, *, at_event_time: bool = False) -> None:
        super().__init__(start_ms, 1.0, clock=time.time)
        self.origin: float | None = start_ms / 1000.0 if at_event_time else None

    def delay_s(self, ts_ms: float) -> float:
        now = time.time()
        if self.origin is None:
            self.origin = now
        return self.origin + (ts_ms - self.start_ms) / 1000.0 - now

    def wall_of(self, ts_ms: float) -> float:
        assert self.origin is not None
        return self.origin + (ts_ms - self.start_ms) / 1000.0


def traffic_start_ms(rate_eps: float, seconds: float, wall: float) -> float:
    """When a lag run's event time starts: once its messages are generated and frozen, so that event time
    equals the wall clock when they are sent, as with live services.

    Generated from "now", the events of a 20k ev/s run would start ~15 s behind the wall clock (the time
    it takes to generate them), and the join, whose idle tick moved the watermarks on with the wall clock
    meanwhile, holds new requests until event time catches up: the first 10 s of the run measured that
    start-up, not the pipeline. The generation time is estimated from one second of the same traffic,
    with slack (x2 + 3 s: one run overran x1.5 + 2 s by 2.4 s, and its late start was a burst the join
    took the whole run to absorb); if it is still too short, the first messages leave late, the
    producer's lateness (counted in the lag) says so, and the run's ``start_slack_s`` is negative."""
    began = time.perf_counter()
    sample = sum(
        1 for _ in generate(SCENARIO, rate_rps=rate_eps / EVENTS_PER_REQUEST, duration_s=1.0, seed=98, start_ms=0.0)
    )
    per_traffic_s = (time.perf_counter() - began) / max(sample, 1) * rate_eps
    return (wall + 2.0 * per_traffic_s * seconds + 3.0) * 1000.0


#: Event time starts at least this long after the messages are ready, or they are generated again.
MIN_START_SLACK_S = 1.0


def lag_traffic(rate_eps: float, seconds: float, attempts: int = 3) -> tuple[float, list[Any], dict[str, float]]:
    """The lag run's messages, frozen, with event time starting after they are ready: (start_ms, messages, details).

    The messages are millions of objects the producer never changes: generated with the collector off, then
    frozen, out of its reach, so that its full collections can neither slow the generation down as the list
    grows nor pause the paced producer (counted as pipeline lag). No gc.collect() before the freeze: over
    this heap it took seconds. The estimate from one second of traffic can still be short: in the bench's
    process, after the throughput phase, the whole generation ran ~5x slower per event than the sample
    (11.2 s, not 2.2 s; 3.4 s in a fresh process) and the traffic started 3-4 s late. The time is the
    kernel's: 6.6 s system against 4.4 s user, most likely page faults on memory the process had not used
    before (the VM's kernel is a Firecracker build; not verified further). Then the messages are
    generated again, from a start that allows 1.5x the measured time + 2 s. The second pass reuses the
    freed memory: 0.3 s system, 2.7 s user, in the same run. The user and system seconds of each attempt
    are in the details."""
    details: dict[str, float] = {}
    estimate_s: float | None = None
    for attempt in range(1, attempts + 1):
        gc.disable()
        try:
            began, times0 = time.perf_counter(), os.times()
            wall = time.time()
            start_ms = (wall + estimate_s) * 1000.0 if estimate_s else traffic_start_ms(rate_eps, seconds, wall)
            messages = list(
                generate(
                    SCENARIO, rate_rps=rate_eps / EVENTS_PER_REQUEST, duration_s=seconds, seed=99, start_ms=start_ms
                )
            )
            took_s = time.perf_counter() - began
            times1 = os.times()
            details[f"generate_user_s_attempt_{attempt}"] = times1.user - times0.user
            details[f"generate_system_s_attempt_{attempt}"] = times1.system - times0.system
            slack_s = start_ms / 1000.0 - time.time()
            if slack_s >= MIN_START_SLACK_S or attempt == attempts:
                gc.freeze()
                details.update(generate_s=took_s, generate_attempts=float(attempt))
                return start_ms, messages, details
            details[f"generate_s_attempt_{attempt}"] = took_s
            estimate_s = 1.5 * took_s + 2.0
            del messages
        finally:
            gc.enable()
    raise AssertionError("unreachable")


def steady_rate(progress: Sequence[tuple[float, int]], origin: float, seconds: float) -> float:
    """Messages per second between ``origin + 5 s`` and ``origin + seconds - 2 s``, from (wall, sent) samples."""
    inside = [(at, sent) for at, sent in progress if origin + 5.0 <= at <= origin + seconds - 2.0]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def lags_ms(
    keys: Mapping[tuple[int, int], bytes],
    commits: Sequence[CommitSample],
    produced_at: Mapping[bytes, float],
) -> list[float]:
    """Lag in ms of every record whose key is a request of ``produced_at`` (first record per request)."""
    by_partition: dict[int, tuple[list[float], list[int]]] = {}
    for p in {p for p, _ in keys}:
        by_partition[p] = ([t for t, _ in commits], [c.get(p, 0) for _, c in commits])
    first_visible: dict[bytes, float] = {}
    for (p, offset), key in keys.items():
        if key not in produced_at:
            continue
        times, values = by_partition[p]
        i = bisect_right(values, offset)
        if i >= len(times):
            continue
        seen = first_visible.get(key)
        if seen is None or times[i] < seen:
            first_visible[key] = times[i]
    return [(t - produced_at[k]) * 1000.0 for k, t in first_visible.items()]


def join_output_lags(
    keys: Mapping[tuple[int, int], bytes], emitted_ms: Mapping[tuple[int, int], int], produced_at: Mapping[bytes, float]
) -> dict[bytes, float]:
    """Per request of ``produced_at``: ms from its last event's scheduled time to the join's first record of it."""
    first: dict[bytes, float] = {}
    for where, key in keys.items():
        if key in produced_at and where in emitted_ms:
            first[key] = min(first.get(key, math.inf), emitted_ms[where] / 1000.0)
    return {k: (t - produced_at[k]) * 1000.0 for k, t in first.items()}


def _p95_by_period(lags: Mapping[bytes, float], produced_at: Mapping[bytes, float], period_s: float) -> list[float]:
    """P95 of ``lags`` per ``period_s`` of produce time, from the first request on: where in the run lag grew."""
    if not lags:
        return []
    origin = min(produced_at[k] for k in lags)
    buckets: dict[int, list[float]] = {}
    for key, value in lags.items():
        buckets.setdefault(int((produced_at[key] - origin) / period_s), []).append(value)
    return [round(percentile(buckets[i], 0.95)) if i in buckets else -1.0 for i in range(max(buckets) + 1)]


def _max_by_period(samples: Sequence[float], every_s: float, period_s: float) -> list[float]:
    """The largest of evenly spaced ``samples`` (one per ``every_s`` of schedule) per ``period_s``."""
    out: dict[int, float] = {}
    for i, value in enumerate(samples):
        bucket = int(i * every_s / period_s)
        out[bucket] = max(out.get(bucket, value), value)
    return [round(out[i]) for i in sorted(out)]


def percentile(values: Sequence[float], q: float) -> float:
    """The lower nearest-rank quantile (numpy ``method='lower'`` for these sizes)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure_lag(session: PipelineSession, rate_eps: float, seconds: float, timeout_s: float = 120.0) -> dict[str, Any]:
    """Offer ``rate_eps`` events/s for ``seconds`` to the running session; lag percentiles per request."""
    settings = session.settings
    start_ms, messages, generation = lag_traffic(rate_eps, seconds)
    last_ts: dict[bytes, float] = {}
    for key, _, ts in messages:
        last_ts[key] = max(ts, last_ts.get(key, 0.0))
    pacer = WallPacer(start_ms, at_event_time=True)
    requests_topic = settings.topic("requests")
    start_slack_s = start_ms / 1000.0 - time.time()  # > 0: generated before event time starts
    try:
        result: dict[str, Any] = asyncio.run(_run(session, messages, pacer, requests_topic, seconds, timeout_s))
    finally:
        gc.unfreeze()
    produced_at = {k: pacer.wall_of(ts) for k, ts in last_ts.items()}
    emitted_ms: dict[tuple[int, int], int] = {}
    keys = read_keys(settings.kafka_bootstrap, result["starts"], result["ends"], emitted_ms)
    lags = lags_ms(keys, result["commits"], produced_at)
    join_lags_by_key = join_output_lags(keys, emitted_ms, produced_at)
    join_lags = list(join_lags_by_key.values())
    missing = len(produced_at) - len(lags)
    if missing:
        raise AssertionError(f"{missing} of {len(produced_at)} lag-run requests never became visible")
    session.requests_expected += len(produced_at)
    return {
        "figures": {
            "lag_offered_eps": rate_eps,
            # The rate sent between 5 s in and 2 s before the offered traffic ends: its requests' first and last
            # seconds ramp up and down (a request's stages span seconds), so the whole run's mean is lower.
            "lag_achieved_eps": result["steady_eps"],
            "join_grace_ms": float(settings.join.grace_ms),
            "lag_p50_ms": percentile(lags, 0.5),
            "lag_p95_ms": percentile(lags, 0.95),
            "lag_max_ms": max(lags),
        },
        "details": {
            "events": len(messages),
            "requests": len(produced_at),
            "seconds": seconds,
            "start_slack_s": start_slack_s,
            **generation,
            "commit_polls": len(result["commits"]),
            "sent_mean_eps": len(messages) / result["sending_s"],
            # The share of the lag up to the join's output (the record's produce time on the requests topic);
            # the rest is the writer's (read, insert, commit) and the 50 ms commit poll.
            "join_output_p50_ms": percentile(join_lags, 0.5),
            "join_output_p95_ms": percentile(join_lags, 0.95),
            "join_output_p95_ms_by_5s": _p95_by_period(join_lags_by_key, produced_at, 5.0),
            # How late the bench's own producer sent, against the schedule (sampled every 2,000 messages):
            # counted in the lag above, though no part of the pipeline.
            "producer_late_max_ms": max(result["late_ms"], default=0.0),
            "producer_late_max_ms_by_5s": _max_by_period(result["late_ms"], 2_000 / rate_eps, 5.0),
            "idle_tick_ms": settings.join.idle_tick_ms,
        },
    }


async def _run(
    session: PipelineSession,
    messages: list[Any],
    pacer: WallPacer,
    requests_topic: str,
    seconds: float,
    timeout_s: float,
) -> dict[str, Any]:
    settings = session.settings
    group = f"{settings.app_id}-writer"
    join = session.join
    assert join is not None
    async with Offsets(settings.kafka_bootstrap) as offsets:
        starts = await offsets.ends([requests_topic])
        commits: list[CommitSample] = []
        late_ms: list[float] = []

        progress: list[tuple[float, int]] = []

        def on_progress(sent: int, last_ts_ms: float) -> None:
            if sent < len(messages):  # the last call comes after the final acknowledgements
                late_ms.append(max(0.0, (time.time() - pacer.wall_of(last_ts_ms)) * 1000.0))
                progress.append((time.time(), sent))

        finished_at: list[float] = []
        producing = asyncio.create_task(
            produce_messages(
                messages,
                topic=settings.topic("stage-events"),
                client_kwargs=kafka_client_kwargs(settings),
                pacer=pacer,
                on_progress=on_progress,
            )
        )
        producing.add_done_callback(lambda _: finished_at.append(time.time()))
        deadline = time.monotonic() + seconds + timeout_s
        ends: dict[TopicPartition, int] = {}
        while time.monotonic() < deadline:
            committed = await offsets.committed(group)
            commits.append(
                (time.time(), {tp.partition: o for tp, o in committed.items() if tp.topic == requests_topic})
            )
            # Nothing open after the last event was produced: every record is on the topic, so the ends
            # read now are final, and the run is over once the writer has committed up to them.
            if producing.done() and join.metric("ttft_open_requests") == 0:
                ends = await offsets.ends([requests_topic])
                committed = await offsets.committed(group)
                commits.append(
                    (
                        time.time(),
                        {tp.partition: o for tp, o in committed.items() if tp.topic == requests_topic},
                    )
                )
                if all(commits[-1][1].get(tp.partition, 0) >= end for tp, end in ends.items()):
                    break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError("the lag run did not drain")
        report = producing.result()
    # The rate achieved: from the first message's event time (the pacer holds it until the wall clock gets
    # there) to the last acknowledgement. The producer's own elapsed time also counts its start-up and the
    # wait for event time to begin (the run's start slack, several seconds), which is not a rate.
    sending_s = finished_at[0] - pacer.wall_of(messages[0][2])
    return {
        "steady_eps": steady_rate(progress, pacer.wall_of(messages[0][2]), seconds),
        "starts": starts,
        "ends": ends,
        "commits": commits,
        "produce_s": report.elapsed_s,
        "sending_s": sending_s,
        "late_ms": late_ms,
    }
