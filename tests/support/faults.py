"""Fault scenarios over the real pipeline: one runner, a fault-free reference, and the stores compared.

:func:`run` starts a writer and a join worker on fresh topics and a fresh store, produces ``traffic`` with
an idempotent producer (paced, so the stream is still flowing when a fault fires), lets ``fault`` watch the
workers' ``/metrics`` until its trigger (work in flight: un-acknowledged offsets, open requests, pending
windows), injects and recovers it, waits until the pipeline drained and closed every window, stops the
workers, and reads the store from a subprocess (chDB holds one data directory per process):
``python -m tests.support.faults snapshot`` prints a :class:`StoreSnapshot` as JSON.

A snapshot keeps what must not depend on faults: every ``requests`` column except insert/late/amendment
bookkeeping, every ``stage_windows`` column except ``computed_version``, the alerts' identities and
event-time transitions, and the dead letters' sources. Fault classes live in ``tests/support/fault_kinds.py``
style in the test module; this file holds the runner and the one-fault-at-a-time protocol (:class:`Fault`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.support.pipeline import REPO, Pipeline, WorkerProcess, group_lag, pipeline_env

#: Columns that record how a row got there (insert time, late arrivals, merged amendments), not what it is.
REQUEST_BOOKKEEPING = ("inserted_at", "amendment_ids", "late_events", "record_version")
WINDOW_BOOKKEEPING = ("computed_version",)
ALERT_COLUMNS = (
    "fingerprint, alertname, labels, state, window_start, event_at, active_at, fired_at, resolved_at, muted"
)
POLL_S = 0.05


# --- traffic --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultTraffic:
    """Messages to produce, in order, and what they hold."""

    name: str
    messages: list[tuple[bytes, bytes]]
    requests: int
    malformed: int
    duplicates: int
    start_ms: int
    end_ms: int


def canary_traffic(
    *, rate_rps: float = 25.0, duration_s: float = 420.0, seed: int = 8, hours_ago: float = 3.0
) -> FaultTraffic:
    """``canary-regression`` traffic (a slow canary arm with low draft acceptance, so alerts fire) with
    duplicates, missing stages, orphans and malformed messages, starting ``hours_ago`` in event time so
    every window closes as soon as the stream is idle."""
    from streams.sim.faults import ErrorRates
    from streams.sim.traffic import generate_with_truth

    start_ms = int((time.time() - hours_ago * 3600) * 1000) // 60_000 * 60_000
    errors = ErrorRates(duplicate=0.02, missing_stage=0.02, orphan=0.01, malformed=0.005)
    messages, truth = generate_with_truth(
        "canary-regression",
        rate_rps=rate_rps,
        duration_s=duration_s,
        seed=seed,
        start_ms=start_ms,
        errors=errors,
    )
    # Optional recall sub-stages are left out: they cost join time and exercise nothing a fault needs.
    kept = [(k, v) for k, v, _ in messages if not any(s in v for s in _SUB_STAGES)]
    return FaultTraffic(
        name=f"canary-regression:{rate_rps}rps:{duration_s}s:seed{seed}",
        messages=kept,
        requests=len(truth.requests),
        malformed=len(truth.malformed),
        duplicates=len(truth.duplicates),
        start_ms=start_ms,
        end_ms=int(start_ms + duration_s * 1000),
    )


_SUB_STAGES = tuple(f'"stage":"{s}"'.encode() for s in ("vector_recall", "bm25_recall", "rerank"))


class PacedProducer(threading.Thread):
    """Produces the traffic in chunks with pauses, idempotently (a retried send is never a duplicate), and
    rides out a broker restart on its own (long request timeout, client retries)."""

    def __init__(
        self, bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], chunk: int, pause_s: float
    ) -> None:
        super().__init__(name="paced-producer", daemon=True)
        self.bootstrap, self.topic, self.messages = bootstrap, topic, messages
        self.chunk, self.pause_s = chunk, pause_s
        self.acked = 0
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the runner, which owns the assertion
            self.error = exc
        finally:
            self.finished.set()

    async def _produce(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_batch_size=512 * 1024,
            request_timeout_ms=120_000,
            retry_backoff_ms=250,
        )
        await producer.start()
        try:
            for i in range(0, len(self.messages), self.chunk):
                part = self.messages[i : i + self.chunk]
                futures = [await producer.send(self.topic, value=v, key=k) for k, v in part]
                await asyncio.gather(*futures)
                self.acked += len(part)
                await asyncio.sleep(self.pause_s)
        finally:
            await producer.stop()


# --- the store, read from another process -----------------------------------------------------------


@dataclass
class StoreSnapshot:
    """The comparable content of one run's store (normalised: bookkeeping dropped, rows sorted)."""

    requests: list[dict[str, Any]]
    stage_windows: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    #: rows before FINAL: replays absorbed by ReplacingMergeTree show up here (until parts merge)
    raw_request_rows: int
    #: request ids with more than one row after FINAL (must be 0)
    duplicated: int

    def request_ids(self) -> set[str]:
        return {str(r["request_id"]) for r in self.requests}


def _query_snapshot() -> dict[str, Any]:
    """Runs in the snapshot subprocess: one chDB open, every query, JSON out."""
    from tests.support.dump_store import _plain

    from streams.settings import load_settings
    from streams.store.client import make_client

    settings = load_settings()
    client = make_client(settings)
    db = settings.clickhouse_database

    def rows(sql: str) -> list[dict[str, Any]]:
        result = client.query(sql.replace("{db}", db))
        return [{k: _plain(v) for k, v in row.items()} for row in result.named_results()]

    drop_requests = ", ".join(REQUEST_BOOKKEEPING)
    drop_windows = ", ".join(WINDOW_BOOKKEEPING)
    counts = rows(
        "SELECT (SELECT count() FROM {db}.requests) AS raw, "
        "(SELECT count() - uniqExact(request_id) FROM {db}.requests FINAL) AS duplicated"
    )[0]
    return {
        "requests": rows(f"SELECT * EXCEPT ({drop_requests}) FROM {{db}}.requests FINAL ORDER BY request_id"),
        "stage_windows": rows(
            f"SELECT * EXCEPT ({drop_windows}) FROM {{db}}.stage_windows FINAL "
            "ORDER BY window_start, tenant_id, version_id, stage"
        ),
        "alerts": rows(f"SELECT {ALERT_COLUMNS} FROM {{db}}.alerts FINAL ORDER BY fingerprint, state, event_at"),
        "dead_letters": rows(
            "SELECT source_topic, source_partition, source_offset, reason_code FROM {db}.dead_letters FINAL "
            "ORDER BY source_partition, source_offset"
        ),
        "raw_request_rows": int(counts["raw"]),
        "duplicated": int(counts["duplicated"]),
    }


def read_snapshot(env: dict[str, str]) -> StoreSnapshot:
    """The store of a finished run (its writer has exited), read by a subprocess."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.faults", "snapshot"],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=180,
        check=False,
    )
    if out.returncode != 0:
        raise AssertionError(f"store snapshot failed: {out.stderr.decode()[-3000:]}")
    data = json.loads(out.stdout.decode().strip().splitlines()[-1])
    for row in data["dead_letters"]:  # topic names carry the run's prefix
        row["source_topic"] = str(row["source_topic"]).rpartition(".")[2]
    return StoreSnapshot(**data)


def differences(reference: StoreSnapshot, other: StoreSnapshot, limit: int = 8) -> list[str]:
    """Human-readable differences between two snapshots (empty when equal)."""
    out: list[str] = []
    ref = {r["request_id"]: r for r in reference.requests}
    got = {r["request_id"]: r for r in other.requests}
    lost, extra = sorted(set(ref) - set(got)), sorted(set(got) - set(ref))
    if lost:
        out.append(f"requests lost: {len(lost)}, e.g. {lost[:limit]}")
    if extra:
        out.append(f"requests unexpected: {len(extra)}, e.g. {extra[:limit]}")
    wrong = [
        f"{rid}.{k}: {ref[rid].get(k)!r} != {got[rid].get(k)!r}"
        for rid in sorted(set(ref) & set(got))
        for k in sorted(set(ref[rid]) | set(got[rid]))
        if not _same(ref[rid].get(k), got[rid].get(k))
    ]
    if wrong:
        out.append(f"request values differ: {len(wrong)}, e.g. {wrong[:limit]}")
    if other.duplicated:
        out.append(f"request ids stored twice after FINAL: {other.duplicated}")
    for name in ("stage_windows", "alerts", "dead_letters"):
        a, b = _keyed(getattr(reference, name)), _keyed(getattr(other, name))
        if a != b:
            only_a = [k for k in a - b][:limit]
            only_b = [k for k in b - a][:limit]
            out.append(f"{name} differ: {len(a - b)} only in reference {only_a}; {len(b - a)} only here {only_b}")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def _keyed(rows: list[dict[str, Any]]) -> set[str]:
    return {json.dumps(r, sort_keys=True, ensure_ascii=False) for r in rows}


# --- the runner ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunContext:
    """What a fault sees and may change while the pipeline runs."""

    settings: Any
    pipe: Pipeline
    join: WorkerProcess
    writer: WorkerProcess
    producer: PacedProducer
    traffic: FaultTraffic
    observed: dict[str, Any] = field(default_factory=dict)

    @property
    def join_group(self) -> str:
        return f"{self.settings.app_id}-join"

    @property
    def writer_group(self) -> str:
        return f"{self.settings.app_id}-writer"

    def writer_topics(self) -> list[str]:
        return [self.settings.topic("requests"), self.settings.topic("dead-letter")]

    def metrics(self, worker: WorkerProcess) -> dict[str, float]:
        """The worker's metrics summed over labels ({} while it does not answer)."""
        try:
            raw = worker.metrics()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for key, value in raw.items():
            name = key.partition("{")[0]
            out[name] = out.get(name, 0.0) + value
        return out

    def restart(self, role: str, sig: int = signal.SIGKILL) -> float:
        """Stop ``role`` with ``sig``, start it again, wait until healthy; returns the seconds it took."""
        old = self.join if role == "join" else self.writer
        t0 = time.monotonic()
        if sig == signal.SIGKILL:
            old.proc.send_signal(signal.SIGKILL)
            old.proc.wait(30)
        else:
            rc = self.pipe.stop(old, sig)
            self.observed[f"{role}_stop_rc"] = rc
        new = self.pipe.start(role, free_port())
        self.pipe.wait_healthy(new, timeout=120)
        if role == "join":
            self.join = new
        else:
            self.writer = new
        return time.monotonic() - t0

    def wait_progress(self, worker_role: str, metric: str, timeout: float = 120.0) -> float:
        """Seconds until ``metric`` of the (current) worker of ``worker_role`` is above zero."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            worker = self.join if worker_role == "join" else self.writer
            if self.metrics(worker).get(metric, 0.0) > 0:
                return time.monotonic() - t0
            time.sleep(POLL_S * 4)
        raise AssertionError(f"{worker_role} made no progress ({metric}) in {timeout}s")


class Fault:
    """One fault: where it runs, when it fires, how it is injected and recovered. The base is no fault."""

    name = "none"
    #: producer pacing: messages per chunk, pause between chunks
    chunk = 4_000
    pause_s = 0.25

    def prepare(self, home: Path) -> dict[str, str]:
        """Extra worker environment (and any server the fault needs); called before the workers start."""
        return {}

    def bootstrap(self, default: str) -> str:
        """The broker this run uses (a fault that restarts the broker brings its own)."""
        return default

    def armed(self, ctx: RunContext, join: dict[str, float], writer: dict[str, float]) -> bool:
        """True once work is in flight the way this fault wants it (polled every ~50 ms)."""
        return False

    def inject(self, ctx: RunContext) -> None:
        """Inject the fault and bring the pipeline back; record what was seen in ``ctx.observed``."""

    def before_stop(self, ctx: RunContext) -> None:
        """Runs after the pipeline drained, before the workers stop."""

    def close(self) -> None:
        """Stop whatever :meth:`prepare` started."""


@dataclass
class RunResult:
    """One run: the store it left, what was sent, and what the fault observed."""

    fault: str
    snapshot: StoreSnapshot
    sent_messages: int
    sent_requests: int
    seconds: float
    phases: dict[str, float]
    observed: dict[str, Any]

    def counts(self, reference: StoreSnapshot | None = None) -> dict[str, Any]:
        """sent, stored, dead-lettered, lost, duplicated (and absorbed replays), time to recover."""
        base = reference or self.snapshot
        return {
            "fault": self.fault,
            "sent_requests": self.sent_requests,
            "sent_messages": self.sent_messages,
            "stored": len(self.snapshot.requests),
            "dead_lettered": len(self.snapshot.dead_letters),
            "lost": len(base.request_ids() - self.snapshot.request_ids()),
            "duplicated": self.snapshot.duplicated,
            "absorbed_rows": self.snapshot.raw_request_rows - len(self.snapshot.requests),
            "alerts": len(self.snapshot.alerts),
            "recover_s": self.observed.get("recover_s"),
            "seconds": round(self.seconds, 1),
        }


def run(traffic: FaultTraffic, fault: Fault | None, *, bootstrap: str, home: Path) -> RunResult:
    """Run the pipeline over ``traffic`` with ``fault`` (None: the reference) on fresh topics and store."""
    from streams.kafka.topics import ensure_topics
    from streams.settings import Settings

    fault = fault or Fault()
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    home.mkdir(parents=True, exist_ok=True)
    try:
        extra = fault.prepare(home)
        prefix = f"flt{uuid.uuid4().hex[:8]}"
        settings = Settings(
            home=home, kafka_bootstrap=fault.bootstrap(bootstrap), topic_prefix=prefix, app_id=f"app-{prefix}"
        )
        asyncio.run(ensure_topics(settings))
        env = pipeline_env(settings, home, **extra)
        pipe = Pipeline(env, home)
        try:
            ctx = _start(settings, pipe, traffic, fault)
            phases["started"] = time.monotonic() - t0
            if fault.name != "none":
                _trigger(ctx, fault)
                phases["fault_done"] = time.monotonic() - t0
            ctx.producer.join(300)
            if ctx.producer.error is not None:
                raise AssertionError(f"producer failed: {ctx.producer.error!r}")
            _wait_drained(ctx)
            phases["drained"] = time.monotonic() - t0
            fault.before_stop(ctx)
            for worker in (ctx.join, ctx.writer):
                rc = pipe.stop(worker)
                assert rc == 0, f"{worker.role} exited rc={rc}:\n{worker.log()[-3000:]}"
        finally:
            pipe.stop_all()
        snapshot = read_snapshot(env)
        phases["snapshot"] = time.monotonic() - t0
    finally:
        fault.close()
    return RunResult(
        fault=fault.name,
        snapshot=snapshot,
        sent_messages=ctx.producer.acked,
        sent_requests=traffic.requests,
        seconds=time.monotonic() - t0,
        phases={k: round(v, 1) for k, v in phases.items()},
        observed=ctx.observed,
    )


def _start(settings: Any, pipe: Pipeline, traffic: FaultTraffic, fault: Fault) -> RunContext:
    writer = pipe.start("writer", free_port())
    join = pipe.start("join", free_port())
    pipe.wait_healthy(writer)
    pipe.wait_healthy(join)
    producer = PacedProducer(
        settings.kafka_bootstrap, settings.topic("stage-events"), traffic.messages, fault.chunk, fault.pause_s
    )
    producer.start()
    return RunContext(settings, pipe, join, writer, producer, traffic)


def _trigger(ctx: RunContext, fault: Fault, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    join: dict[str, float] = {}
    writer: dict[str, float] = {}
    while time.monotonic() < deadline:
        join, writer = ctx.metrics(ctx.join), ctx.metrics(ctx.writer)
        if join and writer and fault.armed(ctx, join, writer):
            ctx.observed["at_trigger"] = {
                "produced": ctx.producer.acked,
                **{k: join.get(k, 0.0) for k in JOIN_IN_FLIGHT},
                **{k: writer.get(k, 0.0) for k in WRITER_IN_FLIGHT},
            }
            fault.inject(ctx)
            return
        time.sleep(POLL_S)
    raise AssertionError(f"fault {fault.name} never triggered; join={join} writer={writer}")


JOIN_IN_FLIGHT = ("ttft_events_consumed_total", "ttft_unacked_events", "ttft_open_requests")
WRITER_IN_FLIGHT = (
    "ttft_unacked_records",
    "ttft_records_written_total",
    "ttft_windows_closed_total",
    "ttft_open_windows",
    "ttft_alerts_pending_delivery",
    "ttft_alert_transitions_total",
    "ttft_insert_failures_total",
)


def _wait_drained(ctx: RunContext, timeout: float = 300.0) -> None:
    s = ctx.settings
    b = s.kafka_bootstrap
    deadline = time.monotonic() + timeout
    status: dict[str, float] = {}
    while time.monotonic() < deadline:
        join, writer = ctx.metrics(ctx.join), ctx.metrics(ctx.writer)
        status = {
            "open_requests": join.get("ttft_open_requests", -1.0),
            "open_windows": writer.get("ttft_open_windows", -1.0),
            "windows_closed": writer.get("ttft_windows_closed_total", 0.0),
            "join_lag": float(group_lag(b, ctx.join_group, [s.topic("stage-events")])),
            "writer_lag": float(group_lag(b, ctx.writer_group, ctx.writer_topics())),
        }
        if (
            status["open_requests"] == 0
            and status["open_windows"] == 0
            and status["windows_closed"] > 0
            and status["join_lag"] == 0
            and status["writer_lag"] == 0
        ):
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {w.role}:{w.port}\n{w.log()[-2000:]}" for w in ctx.pipe.workers)
    raise AssertionError(f"the pipeline did not drain in {timeout}s: {status}\n{logs}")


async def _committed(bootstrap: str, group: str) -> dict[str, int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {f"{tp.topic}:{tp.partition}": meta.offset for tp, meta in offsets.items()}


def committed_offsets(bootstrap: str, group: str) -> dict[str, int]:
    """``{topic:partition: committed offset}`` of a consumer group."""
    return asyncio.run(_committed(bootstrap, group))


def summary(results: list[RunResult], reference: StoreSnapshot) -> str:
    """One line per run with the counts the issue asks for."""
    return "\n".join(json.dumps(r.counts(reference), default=str) for r in results)


def reason_counts(snapshot: StoreSnapshot) -> dict[str, int]:
    return dict(Counter(str(d["reason_code"]) for d in snapshot.dead_letters))


__all__ = [
    "Fault",
    "FaultTraffic",
    "RunContext",
    "RunResult",
    "StoreSnapshot",
    "asdict",
    "canary_traffic",
    "committed_offsets",
    "differences",
    "run",
]


if __name__ == "__main__" and sys.argv[1:] == ["snapshot"]:
    os.environ.setdefault("PYTHONPATH", str(REPO))
    print(json.dumps(_query_snapshot(), ensure_ascii=False))
