"""Close burst: how long closing one big window holds up the writer's commits.

A writer alone on its own prefix. ``N`` request records of one window (two hours back) go straight to
``<prefix>.requests`` and are inserted; then a join-style heartbeat moves the watermark past the window,
so it closes. From just before that heartbeat, a trickle of records of a later window (50 every 100 ms)
is produced, and the writer group's committed offsets are polled every 50 ms: a trickle record's *commit
delay* is the time from its send to the first poll that sees it committed. The figure is the largest
delay of a trickle record sent while the window was closing (from the heartbeat until
``ttft_windows_closed_total`` moved), next to the median delay of those sent before the heartbeat.

The details say where a large delay comes from: when the worst record was sent (seconds after the
heartbeat), the largest gap between this process's offset polls (a stall of this process or the broker),
the longest the writer took to answer ``/metrics`` during the close (served on its event loop: a stall of
the writer's loop, asked from a thread every 50 ms), and the writer's mean insert time of ``requests``
before and during the close (the close process taking a core slows the trickle's inserts; a blocked event
loop does not).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from bench.harness import BenchEnv, Offsets, poll_until
from streams.core.watermarks import WATERMARK_KEY
from streams.kafka.topics import kafka_client_kwargs
from tests.support.records import make_record

WINDOW_MS = 60_000
TRICKLE_EVERY_S = 0.1
TRICKLE_SIZE = 50


def _records(count: int, ws: int, prefix: str) -> list[dict[str, Any]]:
    step = (WINDOW_MS - 1_000) / max(count, 1)
    out = []
    for i in range(count):
        started = ws + 500.0 + i * step
        ttft = 700.0 + (i * 7919) % 1_500
        out.append(
            make_record(
                f"{prefix}-{i:07d}",
                tenant_id=f"t{i % 4}",
                started_at=started,
                first_token_at=started + ttft,
                ttft_ms=ttft,
                retrieval_ms=ttft * 0.3,
                prompt_assemble_ms=ttft * 0.1,
                llm_ttft_ms=ttft * 0.55,
                other_ms=ttft * 0.05,
            )
        )
    return out


def measure_close_burst(env: BenchEnv, count: int, timeout_s: float = 300.0) -> dict[str, Any]:
    settings = env.settings("close")
    env.create_topics(settings)
    pipe = env.pipeline(settings)
    ws = int((time.time() * 1000.0 - 7_200_000) // WINDOW_MS * WINDOW_MS)
    big = [orjson.dumps(r) for r in _records(count, ws, "big")]
    writer = env.start_worker(pipe, "writer")
    try:
        return asyncio.run(_run(env, settings, writer, big, ws, timeout_s))
    finally:
        pipe.stop_all()


async def _run(
    env: BenchEnv, settings: Any, writer: Any, big: list[bytes], ws: int, timeout_s: float
) -> dict[str, Any]:
    topic = settings.topic("requests")
    group = f"{settings.app_id}-writer"
    producer = AIOKafkaProducer(linger_ms=5, max_batch_size=1_048_576, **kafka_client_kwargs(settings))
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        for i, value in enumerate(big):
            await producer.send(topic, value, key=f"big-{i:07d}".encode(), partition=i % len(partitions))
        await producer.flush()
        await _wait(lambda: writer.metric("ttft_records_written_total") >= len(big), timeout_s, "the big window")
        closed0 = writer.metric("ttft_windows_closed_total")
        sent: list[tuple[float, int, int]] = []  # (send time, partition, offset)
        commits: list[tuple[float, dict[int, int]]] = []
        later = ws + 30 * WINDOW_MS  # past the heartbeat's watermark: never closes during the run
        state = {"heartbeat_at": 0.0, "closed_at": 0.0, "n": 0}
        inserts: dict[str, tuple[float, float]] = {}  # the writer's insert time so far, at each mark
        answers: list[tuple[float, float]] = []  # (asked at, seconds) of the writer's /metrics

        async def trickle() -> None:
            while not state["closed_at"] or time.time() < state["closed_at"] + 2.0:
                at = time.time()
                futures = []
                for record in _records(TRICKLE_SIZE, later, f"trickle{state['n']}"):
                    state["n"] += 1
                    p = int(state["n"]) % len(partitions)
                    futures.append((p, await producer.send(topic, orjson.dumps(record), key=b"t", partition=p)))
                for p, future in futures:
                    sent.append((at, p, (await future).offset))
                await asyncio.sleep(TRICKLE_EVERY_S)

        async def poll(offsets: Offsets) -> None:
            while not state["closed_at"] or time.time() < state["closed_at"] + 3.0:
                committed = await offsets.committed(group)
                commits.append((time.time(), {tp.partition: o for tp, o in committed.items() if tp.topic == topic}))
                await asyncio.sleep(0.05)

        async def watch() -> None:
            """The close's end, from the writer's /metrics (asked from a thread: the polls go on meanwhile)."""
            while not state["closed_at"]:
                asked = time.time()
                closed = await asyncio.to_thread(writer.metric, "ttft_windows_closed_total")
                answers.append((asked, time.time() - asked))
                if closed > closed0:
                    state["closed_at"] = time.time()
                    inserts["closed"] = await asyncio.to_thread(_inserts, writer)
                await asyncio.sleep(0.05)

        async with Offsets(settings.kafka_bootstrap) as offsets:
            tasks = [asyncio.create_task(trickle()), asyncio.create_task(poll(offsets)), asyncio.create_task(watch())]
            inserts["start"] = _inserts(writer)
            await asyncio.sleep(2.0)  # the baseline: commits before the close
            inserts["heartbeat"] = _inserts(writer)
            beat = orjson.dumps({"watermark_ms": ws + 20 * WINDOW_MS, "source_partition": 0})
            for p in partitions:
                await producer.send(topic, beat, key=WATERMARK_KEY, partition=p)
            await producer.flush()
            state["heartbeat_at"] = time.time()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
    finally:
        await producer.stop()
    delays = _delays(sent, commits)
    state["metrics_wait_s"] = max((s for t, s in answers if state["heartbeat_at"] <= t), default=math.nan)
    beat_at, closed_at = state["heartbeat_at"], state["closed_at"]
    before = [d for t, d in delays if t < beat_at]
    during = [d for t, d in delays if beat_at <= t <= closed_at]
    worst_at = max(((d, t) for t, d in delays if beat_at <= t <= closed_at), default=(math.nan, math.nan))[1]
    polls = [t for t, _ in commits if beat_at <= t <= closed_at]
    poll_gap_s = max((b - a for a, b in itertools.pairwise(polls)), default=math.nan)
    after = [d for t, d in delays if t > closed_at]
    close_s = writer.metric("ttft_window_close_seconds_sum")
    return {
        "figures": {
            "close_window_records": float(len(big)),
            "close_seconds": close_s,
            "close_commit_delay_before_p50_ms": _median(before),
            "close_commit_delay_during_max_ms": max(during) if during else math.nan,
        },
        "details": {
            "heartbeat_to_closed_s": state["closed_at"] - state["heartbeat_at"],
            "trickle_records_during_close": len(during),
            "commit_delay_before_max_ms": max(before, default=math.nan),
            "commit_delay_during_p50_ms": _median(during),
            "commit_delay_during_p95_ms": sorted(during)[int(len(during) * 0.95)] if during else math.nan,
            "commit_delay_after_max_ms": max(after, default=math.nan),
            # Where the worst delay comes from (see the module docstring).
            "commit_delay_during_max_sent_after_heartbeat_s": worst_at - beat_at,
            "offset_poll_gap_during_max_ms": poll_gap_s * 1000.0,
            "writer_metrics_wait_during_max_ms": state["metrics_wait_s"] * 1000.0,
            "insert_requests_before_mean_ms": _mean_ms(inserts["start"], inserts["heartbeat"]),
            "insert_requests_during_mean_ms": _mean_ms(inserts["heartbeat"], inserts["closed"]),
            "close_sources": {
                k: v for k, v in writer.metrics().items() if k.startswith("ttft_window_close_seconds_count")
            },
        },
    }


def _inserts(writer: Any) -> tuple[float, float]:
    """(seconds, count) of the writer's inserts into ``requests`` so far (``ttft_insert_seconds``)."""
    metrics = writer.metrics()
    labels = '{table="requests"}'
    return metrics.get(f"ttft_insert_seconds_sum{labels}", 0.0), metrics.get(f"ttft_insert_seconds_count{labels}", 0.0)


def _mean_ms(start: tuple[float, float], end: tuple[float, float]) -> float:
    count = end[1] - start[1]
    return (end[0] - start[0]) / count * 1000.0 if count > 0 else math.nan


async def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    await asyncio.to_thread(poll_until, predicate, timeout_s, what, 0.2)


def _delays(
    sent: list[tuple[float, int, int]], commits: list[tuple[float, dict[int, int]]]
) -> list[tuple[float, float]]:
    out = []
    for at, p, offset in sent:
        seen = next((t for t, c in commits if t >= at and c.get(p, 0) > offset), None)
        if seen is not None:
            out.append((at, (seen - at) * 1000.0))
    return out


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else math.nan
