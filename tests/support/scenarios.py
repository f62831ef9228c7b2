"""Shared pieces of the issue 3 / issue 4 acceptance tests: a join + writer pair, traffic, topic reads.

Everything here drives the real components (broker, ``ttft worker`` subprocesses, the chDB store through
a separate process, ``ttft`` CLI commands); nothing is mocked. Traffic is historical (hours before now),
so the writer's idle watermark closes every window as soon as the stream is drained.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from streams.ports import free_port
from streams.settings import Settings
from streams.sim.model import simulate_request
from streams.sim.scenarios import ROUTING_SPECULATIVE
from tests.support.pipeline import REPO, Pipeline, WorkerProcess, group_lag, pipeline_env, produce_sync

#: ``requests`` column of each stage sketch (``other`` is clamped at 0 in the sketch).
STAGE_COLUMNS: dict[str, str] = {
    "retrieval": "retrieval_ms",
    "prompt_assemble": "prompt_assemble_ms",
    "llm_ttft": "llm_ttft_ms",
    "vector_recall": "vector_recall_ms",
    "bm25_recall": "bm25_recall_ms",
    "rerank": "rerank_ms",
    "other": "other_ms",
    "ttft": "ttft_ms",
}
MINUTE_MS = 60_000

#: What goes wrong when a worker reports the wall clock as event time before any traffic (fixed: a join
#: partition without events sends no heartbeat); the check below keeps it fixed.
IDLE_HEARTBEAT_BUG = (
    "a watermark heartbeat carried the wall clock before any event arrived, so every historical window "
    "closes on its first batch and the rule engine never judges the rest"
)


def historical_start_ms(hours_ago: float) -> int:
    """A minute-aligned event-time start ``hours_ago`` before now (windows of 60 s align with it)."""
    return int((time.time() - hours_ago * 3600) * 1000) // MINUTE_MS * MINUTE_MS


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """Write a ``TTFT_CONFIG`` YAML file and return its path."""
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


# --- the pipeline ---------------------------------------------------------------------------------------


@dataclass
class PipelinePair:
    """One ``--role join`` and one ``--role writer`` worker over one settings/home."""

    settings: Settings
    pipe: Pipeline
    join: WorkerProcess
    writer: WorkerProcess

    @classmethod
    def start(cls, settings: Settings, home: Path, **extra_env: str) -> PipelinePair:
        pipe = Pipeline(pipeline_env(settings, home, **extra_env), home)
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pair = cls(settings, pipe, join, writer)
        try:
            pipe.wait_healthy(writer)
            pipe.wait_healthy(join)
        except BaseException:
            pipe.stop_all()
            raise
        return pair

    @property
    def env(self) -> dict[str, str]:
        return self.pipe.env

    def start_writer(self) -> WorkerProcess:
        self.writer = self.pipe.start("writer", free_port())
        self.pipe.wait_healthy(self.writer)
        return self.writer

    def kill_writer(self) -> None:
        """``kill -9`` the writer and reap it."""
        self.writer.proc.send_signal(signal.SIGKILL)
        self.writer.proc.wait(10)

    def drained(self) -> bool:
        """Every event joined and committed, every record stored and every window of it closed."""
        app = self.env["TTFT_APP_ID"]
        s, b = self.settings, self.settings.kafka_bootstrap
        return (
            group_lag(b, f"{app}-join", [s.topic("stage-events")]) == 0
            and self.join.metric("ttft_open_requests") == 0
            and group_lag(b, f"{app}-writer", [s.topic("requests"), s.topic("dead-letter")]) == 0
            and self.writer.metric("ttft_open_windows") == 0
            and self.writer.metric("ttft_windows_closed_total") > 0
        )

    def check_event_time_before_traffic(self, traffic_start_ms: float, idle_s: float = 3.0) -> None:
        """Let the idle workers exchange heartbeats for ``idle_s``, then require the writer's event time to be
        still before the traffic: the premise of replaying or backfilling historical data."""
        time.sleep(idle_s)
        watermark = self.writer.metric("ttft_writer_watermark_ms")
        assert watermark <= traffic_start_ms, (
            f"writer event time {watermark:.0f} is {(watermark - traffic_start_ms) / 1000:.0f} s past the traffic "
            f"before any record arrived: {IDLE_HEARTBEAT_BUG}"
        )

    def caught_up(self) -> bool:
        """The join committed every produced event and the writer every record produced so far."""
        app = self.env["TTFT_APP_ID"]
        s, b = self.settings, self.settings.kafka_bootstrap
        return (
            group_lag(b, f"{app}-join", [s.topic("stage-events")]) == 0
            and group_lag(b, f"{app}-writer", [s.topic("requests"), s.topic("dead-letter")]) == 0
        )

    def produce_in_step(self, chunks: Sequence[Sequence[tuple[bytes, bytes]]], timeout_per_chunk: float) -> None:
        """Produce chunk after chunk, each once the pipeline has caught up with the previous one.

        Event time then advances evenly over every partition, as in live traffic, instead of as a backlog
        whose partitions the consumers drain at different speeds.
        """
        topic = self.settings.topic("stage-events")
        for index, chunk in enumerate(chunks):
            produce_sync(self.settings.kafka_bootstrap, topic, list(chunk))
            self.pipe.wait_for(self.caught_up, timeout_per_chunk, f"the pipeline to catch up with chunk {index}")

    def wait_drained(self, timeout: float, what: str = "the pipeline to drain") -> None:
        self.pipe.wait_for(self.drained, timeout, what)

    def stop(self) -> None:
        """Stop both workers gracefully (join first, so nothing is in flight towards the writer)."""
        try:
            assert self.pipe.stop(self.join) == 0, self.join.log()[-3000:]
            assert self.pipe.stop(self.writer) == 0, self.writer.log()[-3000:]
        finally:
            self.pipe.stop_all()

    def query(self, sql: str) -> list[dict[str, Any]]:
        """One SELECT on the store (``{db}`` is the database); the writer must have exited."""
        return self.pipe.query(sql)


# --- commands -------------------------------------------------------------------------------------------


def run_ttft(env: dict[str, str], *args: str, timeout: float = 300.0) -> str:
    """Run ``ttft <args>`` in a subprocess and return its stdout; a failure raises with stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"ttft {' '.join(args)} failed ({out.returncode}): {out.stderr.decode()[-3000:]}")
    return out.stdout.decode()


def simulate(
    env: dict[str, str],
    scenario: str,
    *,
    rate: float,
    duration_s: int,
    seed: int,
    start_ms: int,
    tenants: Sequence[str] | None = None,
) -> str:
    """``ttft simulate ... --as-fast-as-possible`` into the pipeline's stage-events topic."""
    args = ["simulate", "--scenario", scenario, "--rate", str(rate), "--duration", str(duration_s)]
    args += ["--seed", str(seed), "--start", str(start_ms), "--as-fast-as-possible"]
    if tenants:
        args += ["--tenants", ",".join(tenants)]
    return run_ttft(env, *args, timeout=600)


def iso_ms(ms: float) -> str:
    """An epoch-ms instant as the naive-UTC ISO 8601 text the CLI takes."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000.0))


def breakdown_json(env: dict[str, str], tenant: str, start_ms: float, end_ms: float) -> dict[str, Any]:
    """``ttft breakdown --tenant T --since START --until END --json`` (the writer must have exited)."""
    out = run_ttft(
        env, "breakdown", "--tenant", tenant, "--since", iso_ms(start_ms), "--until", iso_ms(end_ms), "--json"
    )
    data: dict[str, Any] = json.loads(out)
    return data


def whatif_json(env: dict[str, str], tenant: str, start_ms: float, end_ms: float, *args: str) -> dict[str, Any]:
    """``ttft whatif --tenant T --since START --until END --json ARGS`` (the writer must have exited)."""
    span = ("--since", iso_ms(start_ms), "--until", iso_ms(end_ms))
    data: dict[str, Any] = json.loads(run_ttft(env, "whatif", "--tenant", tenant, *span, "--json", *args))
    return data


async def _read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    parts = sorted(int(p["partition"]) for d in described if d["topic"] == topic for p in d["partitions"])
    if not parts:
        raise AssertionError(f"topic {topic} has no partitions: {described}")
    tps = [TopicPartition(topic, p) for p in parts]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[int, int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 60
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took over 60 s")
            batch = await consumer.getmany(*tps, timeout_ms=500)
            for records in batch.values():
                out.extend((r.timestamp, r.offset, r.key, r.value) for r in records)
        out.sort(key=lambda r: (r[0], r[1]))
        return [(k, v) for _, _, k, v in out]
    finally:
        await consumer.stop()


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every message of ``topic`` (no consumer group), in produce-timestamp order."""
    return asyncio.run(_read_topic(bootstrap, topic))


# --- traffic --------------------------------------------------------------------------------------------


def late_request_messages(
    request_id: str,
    tenant: str,
    version: str,
    started_at_ms: float,
    *,
    retrieval_ms: float,
    prompt_assemble_ms: float,
    llm_ttft_ms: float,
) -> list[tuple[bytes, bytes]]:
    """The five required stage events of one complete request, serial, starting at ``started_at_ms``."""
    base = {"request_id": request_id, "tenant_id": tenant, "version_id": version}
    t = started_at_ms
    events: list[dict[str, Any]] = [{**base, "stage": "request_start", "ts_ms": t, "event_id": "start"}]
    for stage, duration in (
        ("retrieval", retrieval_ms),
        ("prompt_assemble", prompt_assemble_ms),
        ("llm_ttft", llm_ttft_ms),
    ):
        t += 1.0
        events.append({**base, "stage": stage, "ts_ms": t, "duration_ms": duration, "event_id": stage})
        t += duration
    events.append({**base, "stage": "first_token", "ts_ms": t + 1.0, "event_id": "first"})
    key = request_id.encode()
    return [(key, orjson.dumps(e)) for e in events]


@dataclass
class RegressionTraffic:
    """Traffic with a retrieval slowdown on one tenant, as produce chunks of one window each."""

    start_ms: int
    window_ms: int
    chunks: list[list[tuple[bytes, bytes]]]
    #: first window start of each phase: ``before``, ``incident``, ``after``
    phase_starts: dict[str, int]
    requests: dict[str, int] = field(default_factory=dict)

    def messages(self, first_chunk: int = 0, end_chunk: int | None = None) -> list[tuple[bytes, bytes]]:
        return [m for chunk in self.chunks[first_chunk:end_chunk] for m in chunk]


def regression_traffic(
    start_ms: int,
    *,
    tenants: dict[str, float],
    incident_tenant: str,
    slowdown: float,
    windows_before: int,
    windows_incident: int,
    windows_after: int,
    seed: int,
    window_ms: int = MINUTE_MS,
    slowdowns: dict[str, float] | None = None,
) -> RegressionTraffic:
    """Poisson traffic of the fixed ("routing-speculative") world per tenant (``tenants``: requests/s);
    ``incident_tenant``'s retrieval is ``slowdown`` times slower during the incident windows (``slowdowns``:
    each of these tenants' by its own factor instead).

    Each chunk holds the events emitted (span end, or instant) during one window, in emission order, so
    producing chunk by chunk is producing in event-time order. The last chunk also holds the stragglers
    of requests started near the end.
    """
    rng = random.Random(seed)
    total = windows_before + windows_incident + windows_after
    end_ms = start_ms + total * window_ms
    incident = (
        start_ms + windows_before * window_ms,
        start_ms + (windows_before + windows_incident) * window_ms,
    )
    timed: list[tuple[float, int, bytes, bytes]] = []
    seq = 0
    counts: dict[str, int] = {}
    slowed = slowdowns if slowdowns is not None else {incident_tenant: slowdown}
    for tenant, rate in tenants.items():
        base = replace(ROUTING_SPECULATIVE, tenant_id=tenant, version_id="v12")
        slow = replace(base, retrieval_slowdown=slowed[tenant]) if tenant in slowed else base
        t = float(start_ms)
        n = 0
        while True:
            t = round(t + rng.expovariate(rate) * 1000.0, 3)
            if t >= end_ms:
                break
            profile = slow if incident[0] <= t < incident[1] else base
            rid = f"reg{seed}-{tenant}-{n}"
            n += 1
            for event in simulate_request(rng, profile, t, rid):
                emit = event["ts_ms"] + event.get("duration_ms", 0.0)
                timed.append((emit, seq, rid.encode(), orjson.dumps(event)))
                seq += 1
        counts[tenant] = n
    timed.sort()
    chunks: list[list[tuple[bytes, bytes]]] = [[] for _ in range(total)]
    for emit, _, key, value in timed:
        index = min(int((emit - start_ms) // window_ms), total - 1)
        chunks[index].append((key, value))
    return RegressionTraffic(
        start_ms=start_ms,
        window_ms=window_ms,
        chunks=chunks,
        phase_starts={"before": start_ms, "incident": incident[0], "after": incident[1]},
        requests=counts,
    )


# --- checks ---------------------------------------------------------------------------------------------


def numpy_window_check(
    requests: Sequence[dict[str, Any]], stage_rows: Sequence[dict[str, Any]]
) -> tuple[int, list[str]]:
    """Compare stored ``stage_windows`` rows with numpy over the ``requests FINAL`` rows of their windows.

    Counts must be equal; p50/p95/p99 within 1 % of ``np.quantile(method='lower')`` where n >= 50 (the
    contract's accuracy). Returns (quantiles checked, mismatch descriptions).
    """
    values: dict[tuple[int, str, str, str], list[float]] = {}
    for r in requests:
        if r["status"] not in ("complete", "missing_stage"):
            continue
        for stage, column in STAGE_COLUMNS.items():
            v = r.get(column)
            if v is None:
                continue
            key = (int(r["window_start"]), r["tenant_id"], r["version_id"], stage)
            values.setdefault(key, []).append(max(0.0, float(v)) if stage == "other" else float(v))
    checked = 0
    problems: list[str] = []
    for row in stage_rows:
        if row["stage"] not in STAGE_COLUMNS:
            continue
        key = (int(row["window_start"]), row["tenant_id"], row["version_id"], row["stage"])
        xs = values.get(key, [])
        if len(xs) != int(row["count"]):
            problems.append(f"{key}: stored count {row['count']}, numpy {len(xs)}")
            continue
        if len(xs) < 50:
            continue
        arr = np.asarray(xs)
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            want = float(np.quantile(arr, q, method="lower"))
            got = row[name]
            checked += 1
            if got is None or abs(float(got) - want) > 0.01 * abs(want) + 1e-9:
                problems.append(f"{key} {name}: stored {got}, numpy {want}")
    return checked, problems
