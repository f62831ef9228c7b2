"""Baseline B, the peer: :mod:`bench.naive_join_app` as a Faust worker process over a prefix of the traffic.

Timed from the first event the worker reads (the wall time it writes to its stats file) until the
consumer group has committed every event and the output topic holds one record per request: the same
"acknowledged and durable" end as our pipeline's, minus the store (so the ratio favours B).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from bench.harness import BenchEnv, Offsets, poll_until_async, produce
from bench.procstat import MIB, read_proc
from bench.traffic import Traffic, first_requests
from tests.support.pipeline import REPO


def measure_naive(env: BenchEnv, traffic: Traffic, requests: int, timeout_s: float = 300.0) -> dict[str, float | None]:
    """Events/s and peak RSS of baseline B over the events of the first ``requests`` requests."""
    settings = env.settings("naive")
    env.create_topics(settings, ["stage-events", "requests"])
    messages = first_requests(traffic, requests)
    events_topic, requests_topic = settings.topic("stage-events"), settings.topic("requests")
    produce(settings, events_topic, messages)
    app_id = f"{settings.app_id}-naive"
    stats = settings.home / "naive-stats.json"
    log_path = settings.home / "naive-worker.log"
    child_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "BENCH_NAIVE_BROKER": env.bootstrap,
        "BENCH_NAIVE_APP_ID": app_id,
        "BENCH_NAIVE_EVENTS_TOPIC": events_topic,
        "BENCH_NAIVE_REQUESTS_TOPIC": requests_topic,
        "BENCH_NAIVE_PARTITIONS": str(settings.partitions),
        "BENCH_NAIVE_DATADIR": str(settings.home / "naive-data"),
        "BENCH_NAIVE_STATS": str(stats),
    }
    cmd = [sys.executable, "-m", "bench.naive_join_app", "worker", "-l", "warn"]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, env=child_env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        expected_requests = len({m[0] for m in messages})
        ended, peak, cpu_s = asyncio.run(
            _wait_done(env, proc, log_path, app_id, events_topic, requests_topic, expected_requests, stats, timeout_s)
        )
        first = json.loads(stats.read_text())["first_event_at"]
        elapsed = ended - first
        return {
            "naive_events_per_s": len(messages) / elapsed,
            "naive_events": float(len(messages)),
            "rss_peak_naive_mb": peak / MIB,
            "naive_cpu_us_per_event": cpu_s / len(messages) * 1e6,
        }
    finally:
        _stop(proc)


async def _wait_done(
    env: BenchEnv,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    app_id: str,
    events_topic: str,
    requests_topic: str,
    expected_requests: int,
    stats: Path,
    timeout_s: float,
) -> tuple[float, int, float]:
    """Wall time at which every event was committed and every request emitted; peak RSS; CPU seconds
    of the worker from the first poll that saw its first event (start-up excluded) to the end."""
    peak = 0
    cpu0: float | None = None
    async with Offsets(env.bootstrap) as offsets:

        async def done() -> bool:
            nonlocal peak, cpu0
            if proc.poll() is not None:
                raise RuntimeError(f"naive worker exited rc={proc.returncode}: {_tail(log_path)}")
            sample = read_proc(proc.pid)
            peak = max(peak, sample.peak_rss_bytes)
            if cpu0 is None and stats.exists():
                cpu0 = sample.cpu_s
            if await offsets.lag(app_id, [events_topic]) != 0:
                return False
            return sum((await offsets.ends([requests_topic])).values()) >= expected_requests

        ended = await poll_until_async(done, timeout_s, "the naive Faust join to commit every event", 0.1)
        cpu_s = read_proc(proc.pid).cpu_s - (cpu0 or 0.0)
    return ended, peak, cpu_s


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""
