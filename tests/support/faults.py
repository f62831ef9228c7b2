"""Fault scenarios over the real pipeline: one runner, a fault-free reference, and stores compared.

:func:`run` starts a writer and a join worker on fresh topics and a fresh store, produces the traffic with
an idempotent producer (paced, so the stream still flows when the fault fires), lets the :class:`Fault`
watch the workers' ``/metrics`` until its trigger (work in flight: un-acknowledged offsets, open requests,
windows being flushed), injects and recovers it, waits until the pipeline drained and closed every window,
stops the workers and reads the store in a subprocess (chDB holds one data directory per process):
``python -m tests.support.faults snapshot`` prints a :class:`StoreSnapshot` as JSON.

A snapshot keeps what must not depend on faults: every ``requests`` column except insert, late-arrival
and amendment bookkeeping; every ``stage_windows`` column except ``computed_version``; the alerts'
identities and event-time transitions (no delivery times); the dead letters' sources.

:class:`FaultLab` runs the reference and several faults concurrently (most of a fault run is waiting).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streams.ports import free_port
from streams.store.shutdown import exit_process
from tests.support.pipeline import REPO, Pipeline, WorkerProcess, group_lag, pipeline_env

#: How a row got there (insert time, late arrivals, merged amendments; record_version encodes late_events).
REQUEST_BOOKKEEPING = ("inserted_at", "amendment_ids", "late_events", "record_version")
ALERT_COLUMNS = "fingerprint, alertname, labels, state, window_start, event_at, active_at, fired_at, resolved_at"
_SUB_STAGES = tuple(f'"stage":"{s}"'.encode() for s in ("vector_recall", "bm25_recall", "rerank"))
POLL_S = 0.05


# --- traffic ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultTraffic:
    """Messages to produce, in order, and what they hold."""

    name: str
    messages: list[tuple[bytes, bytes]]
    requests: int
    start_ms: int
    end_ms: int


def canary_traffic(
    *, rate_rps: float = 25.0, duration_s: float = 420.0, seed: int = 8, hours_ago: float = 3.0
) -> FaultTraffic:
    """``canary-regression`` traffic (a canary arm with low draft acceptance, so alerts fire) with duplicates,
    missing stages, orphans and malformed messages, ``hours_ago`` in event time so every window closes as
    soon as the stream is idle. The optional recall sub-stages are left out: they cost join time and
    exercise nothing a fault needs."""
    from streams.sim.faults import ErrorRates
    from streams.sim.traffic import generate_with_truth

    start_ms = int((time.time() - hours_ago * 3600) * 1000) // 60_000 * 60_000
    errors = ErrorRates(duplicate=0.02, missing_stage=0.02, orphan=0.01, malformed=0.005)
    messages, truth = generate_with_truth(
        "canary-regression", rate_rps=rate_rps, duration_s=duration_s, seed=seed, start_ms=start_ms, errors=errors
    )
    kept = [(k, v) for k, v, _ in messages if not any(s in v for s in _SUB_STAGES)]
    return FaultTraffic(
        name=f"canary-regression {rate_rps} rps x {duration_s} s seed {seed}",
        messages=kept,
        requests=len(truth.requests),
        start_ms=start_ms,
        end_ms=int(start_ms + duration_s * 1000),
    )


class PacedProducer(threading.Thread):
    """Produces the traffic in chunks with pauses; idempotent (a retried send is never a duplicate) and
    patient (rides out a broker restart by itself: long request timeout, client retries)."""

    def __init__(self, bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], chunk: int, pause_s: float):
        super().__init__(name="paced-producer", daemon=True)
        self.bootstrap, self.topic, self.messages = bootstrap, topic, messages
        self.chunk, self.pause_s = chunk, pause_s
        self.acked = 0
        self.error: BaseException | None = None
        #: while it returns True the producer waits (keeps it from running far ahead of a slow join)
        self.hold: Any = None

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # the runner owns the assertion
            self.error = exc

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
                while self.hold is not None and self.hold(self.acked):
                    await asyncio.sleep(0.2)
                part = self.messages[i : i + self.chunk]
                await asyncio.gather(*[await producer.send(self.topic, value=v, key=k) for k, v in part])
                self.acked += len(part)
                await asyncio.sleep(self.pause_s)
        finally:
            await producer.stop()


# --- the store, read by another process ---------------------------------------------------------------


@dataclass
class StoreSnapshot:
    """The comparable content of one run's store (bookkeeping dropped, rows sorted)."""

    requests: list[dict[str, Any]]
    stage_windows: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    #: rows before FINAL: replays absorbed by ReplacingMergeTree show up here until parts merge
    raw_request_rows: int
    #: request ids with more than one row after FINAL (must be 0)
    duplicated: int
    #: stored ``stage_windows`` rows that differ from a recompute of their window from ``requests FINAL``
    recompute_differences: list[str]

    def request_ids(self) -> set[str]:
        return {str(r["request_id"]) for r in self.requests}


def _query_snapshot() -> dict[str, Any]:
    """In the snapshot subprocess: open the store once, run every query."""
    from streams.settings import load_settings
    from streams.store.client import make_client
    from tests.support.dump_store import _plain

    settings = load_settings()
    client = make_client(settings)

    def rows(sql: str) -> list[dict[str, Any]]:
        result = client.query(sql.replace("{db}", settings.clickhouse_database))
        return [{k: _plain(v) for k, v in row.items()} for row in result.named_results()]

    counts = rows(
        "SELECT (SELECT count() FROM {db}.requests) AS raw, "
        "(SELECT count() - uniqExact(request_id) FROM {db}.requests FINAL) AS duplicated"
    )[0]
    return {
        "requests": rows(
            f"SELECT * EXCEPT ({', '.join(REQUEST_BOOKKEEPING)}) FROM {{db}}.requests FINAL ORDER BY request_id"
        ),
        "stage_windows": rows(
            "SELECT * EXCEPT (computed_version) FROM {db}.stage_windows FINAL "
            "ORDER BY window_start, tenant_id, version_id, stage"
        ),
        "alerts": rows(f"SELECT {ALERT_COLUMNS} FROM {{db}}.alerts FINAL ORDER BY fingerprint, state, event_at"),
        "dead_letters": rows(
            "SELECT source_partition, source_offset, reason_code FROM {db}.dead_letters FINAL "
            "ORDER BY source_partition, source_offset"
        ),
        "raw_request_rows": int(counts["raw"]),
        "duplicated": int(counts["duplicated"]),
        "recompute_differences": recompute_differences(client, settings),
    }


def recompute_differences(client: Any, settings: Any, limit: int = 6) -> list[str]:
    """Each stored window's ``stage_windows`` (count and bins per tenant x version x stage) against
    :func:`aggregate_window` over the window's ``requests FINAL``: the writer closes windows from its own
    copy of their records, and that copy must never make a window differ from what the store says."""
    from streams.core.windows import aggregate_window
    from streams.store.aggregates_store import dead_letter_counts, stored_window_series
    from streams.store.requests_store import fetch_window_records

    db, window_ms = settings.clickhouse_database, settings.windows.window_s * 1000
    stored: dict[int, dict[tuple[str, str, str], tuple[int, dict[int, int]]]] = {}
    sql = (
        "SELECT toUnixTimestamp64Milli(window_start), tenant_id, version_id, stage, count, bins "
        f"FROM {db}.stage_windows FINAL"
    )
    for ws, tenant, version, stage, count, bins in client.query(sql).result_rows:
        stored.setdefault(int(ws), {})[(tenant, version, stage)] = (
            int(count),
            {int(k): int(v) for k, v in bins.items()},
        )
    out: list[str] = []
    for ws, rows in sorted(stored.items()):
        agg = aggregate_window(
            fetch_window_records(client, db, ws, window_ms),
            ws,
            settings,
            dead_letters=dead_letter_counts(client, db, ws, ws + window_ms),
            pinned_series=stored_window_series(client, db, ws),
        )
        again = {
            (r["tenant_id"], r["version_id"], r["stage"]): (
                int(r["count"]),
                {int(k): int(v) for k, v in r["bins"].items()},
            )
            for r in agg.stage_windows
        }
        if again != rows:
            keys = sorted(k for k in set(rows) | set(again) if rows.get(k) != again.get(k))
            out.append(f"window {ws}: {len(keys)} stage rows differ from a recompute, e.g. {keys[:limit]}")
    return out


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
    return StoreSnapshot(**json.loads(out.stdout.decode().strip().splitlines()[-1]))


def data_differences(reference: StoreSnapshot, other: StoreSnapshot, limit: int = 6) -> list[str]:
    """Differences in ``requests``, ``stage_windows`` and ``dead_letters`` (empty when equal)."""
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
        if ref[rid].get(k) != got[rid].get(k)
    ]
    if wrong:
        out.append(f"request values differ: {len(wrong)}, e.g. {wrong[:limit]}")
    if other.duplicated:
        out.append(f"request ids stored twice after FINAL: {other.duplicated}")
    out += _rows_differ("stage_windows", reference.stage_windows, other.stage_windows, limit)
    out += [f"stored vs recomputed: {d}" for d in (*reference.recompute_differences, *other.recompute_differences)]
    out += _rows_differ("dead_letters", reference.dead_letters, other.dead_letters, limit)
    return out


def alert_differences(reference: StoreSnapshot, other: StoreSnapshot, limit: int = 6) -> list[str]:
    """Differences in the alerts' identities and transitions (empty when equal)."""
    return _rows_differ(
        "alerts", [_transition(a) for a in reference.alerts], [_transition(a) for a in other.alerts], limit
    )


def _transition(alert: dict[str, Any]) -> dict[str, Any]:
    labels = alert.get("labels") or {}
    return {**alert, "labels": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}


def _rows_differ(name: str, a: list[dict[str, Any]], b: list[dict[str, Any]], limit: int) -> list[str]:
    ka = {json.dumps(r, sort_keys=True, ensure_ascii=False) for r in a}
    kb = {json.dumps(r, sort_keys=True, ensure_ascii=False) for r in b}
    if ka == kb and len(a) == len(b):
        return []
    return [
        f"{name} differ ({len(a)} vs {len(b)} rows): only in reference {sorted(ka - kb)[:limit]}; "
        f"only in this run {sorted(kb - ka)[:limit]}"
    ]


# --- the runner ---------------------------------------------------------------------------------------


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
    def writer_group(self) -> str:
        return f"{self.settings.app_id}-writer"

    def writer_topics(self) -> list[str]:
        return [self.settings.topic("requests"), self.settings.topic("dead-letter")]

    def join_lag(self) -> int:
        return group_lag(
            self.settings.kafka_bootstrap, f"{self.settings.app_id}-join", [self.settings.topic("stage-events")]
        )

    def writer_lag(self) -> int:
        return group_lag(self.settings.kafka_bootstrap, self.writer_group, self.writer_topics())

    def metrics(self, worker: WorkerProcess, *, labelled: bool = False) -> dict[str, float]:
        """The worker's metrics, summed over labels unless ``labelled`` ({} while it does not answer)."""
        try:
            raw = worker.metrics()
        except OSError:
            return {}
        if labelled:
            return raw
        out: dict[str, float] = {}
        for key, value in raw.items():
            name = key.partition("{")[0]
            out[name] = out.get(name, 0.0) + value
        return out

    def restart(self, role: str, sig: int = signal.SIGKILL) -> float:
        """Stop ``role`` with ``sig``, start a new one, wait until healthy; returns the seconds it took."""
        old = self.join if role == "join" else self.writer
        t0 = time.monotonic()
        if sig == signal.SIGKILL:
            old.proc.send_signal(signal.SIGKILL)
            old.proc.wait(30)
        else:
            self.observed[f"{role}_stop_rc"] = self.pipe.stop(old, sig)
        new = self.pipe.start(role, free_port())
        self.pipe.wait_healthy(new, timeout=180)
        if role == "join":
            self.join = new
        else:
            self.writer = new
        return time.monotonic() - t0

    def wait_metric(self, role: str, name: str, above: float = 0.0, timeout: float = 180.0) -> float:
        """Seconds until metric ``name`` of the current ``role`` worker exceeds ``above``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.metrics(self.join if role == "join" else self.writer).get(name, 0.0) > above:
                return time.monotonic() - t0
            time.sleep(POLL_S * 4)
        raise AssertionError(f"{role}: {name} did not pass {above} in {timeout}s")


class Fault:
    """One fault: where it runs, when it fires, how it is injected and recovered. The base is no fault."""

    name = "none"
    #: producer pacing: messages per chunk, pause between chunks, and (if set) at most this many messages
    #: ahead of what the join consumed, so the producer is still producing when the fault fires
    chunk = 4_000
    pause_s = 0.25
    max_ahead: int | None = None
    #: ``windows.idle_close_s`` of the run: the product default (join timeout + grace). A fault whose stall
    #: may last longer (a restart on a busy host) raises it, so windows still close on the join's heartbeats
    #: and not on the wall clock; at the end of the stream it only decides how soon the last windows close.
    idle_close_s = 32.0

    def prepare(self, home: Path) -> dict[str, str]:
        """Extra worker environment (and servers the fault needs); called before the workers start."""
        return {}

    def bootstrap(self, default: str) -> str:
        """The broker of this run (a fault that restarts the broker brings its own)."""
        return default

    def armed(self, ctx: RunContext, join: dict[str, float], writer: dict[str, float]) -> bool:
        """True once work is in flight the way this fault wants it (polled every ~50 ms)."""
        return False

    def inject(self, ctx: RunContext) -> None:
        """Inject the fault and bring the pipeline back; record what was seen in ``ctx.observed``."""

    def before_stop(self, ctx: RunContext) -> None:
        """After the pipeline drained, before the workers stop."""

    def close(self) -> None:
        """Stop whatever :meth:`prepare` started."""


@dataclass
class RunResult:
    """One run: the store it left, what was sent, what the fault observed."""

    fault: str
    snapshot: StoreSnapshot
    sent_messages: int
    sent_requests: int
    seconds: float
    observed: dict[str, Any]

    def counts(self, reference: StoreSnapshot) -> dict[str, Any]:
        """sent, stored, dead-lettered, lost, duplicated (and absorbed replays), time to recover."""
        return {
            "fault": self.fault,
            "sent_requests": self.sent_requests,
            "sent_messages": self.sent_messages,
            "stored": len(self.snapshot.requests),
            "dead_lettered": len(self.snapshot.dead_letters),
            "lost": len(reference.request_ids() - self.snapshot.request_ids()),
            "duplicated": self.snapshot.duplicated,
            "absorbed_replayed_rows": self.snapshot.raw_request_rows - len(self.snapshot.requests),
            "alert_transitions": len(self.snapshot.alerts),
            "recover_s": self.observed.get("recover_s"),
            "run_s": round(self.seconds, 1),
        }


WATCHED = (
    "ttft_events_consumed_total",
    "ttft_unacked_events",
    "ttft_open_requests",
    "ttft_unacked_records",
    "ttft_records_written_total",
    "ttft_windows_closed_total",
    "ttft_open_windows",
    "ttft_alerts_pending_delivery",
    "ttft_alert_transitions_total",
    "ttft_insert_failures_total",
)


def run(traffic: FaultTraffic, fault: Fault | None = None, *, bootstrap: str, home: Path) -> RunResult:
    """Run the pipeline over ``traffic`` with ``fault`` (None: the reference) on fresh topics and store."""
    from streams.kafka.topics import ensure_topics
    from streams.settings import Settings

    fault = fault or Fault()
    t0 = time.monotonic()
    home.mkdir(parents=True, exist_ok=True)
    try:
        extra = fault.prepare(home)
        prefix = f"flt{uuid.uuid4().hex[:8]}"
        settings = Settings(
            home=home, kafka_bootstrap=fault.bootstrap(bootstrap), topic_prefix=prefix, app_id=f"app-{prefix}"
        )
        asyncio.run(ensure_topics(settings))
        env = pipeline_env(settings, home, TTFT_WINDOWS__IDLE_CLOSE_S=str(fault.idle_close_s), **extra)
        pipe = Pipeline(env, home)
        try:
            ctx = _start(settings, pipe, traffic, fault)
            watcher = threading.Thread(target=_watch_premature_close, args=(ctx,), daemon=True)
            watcher.start()
            if fault.name != "none":
                _trigger(ctx, fault)
            ctx.producer.join(600)
            assert ctx.producer.error is None, f"producer failed: {ctx.producer.error!r}"
            _wait_drained(ctx)
            ctx.observed["drained_s"] = round(time.monotonic() - t0, 1)
            fault.before_stop(ctx)
            for worker in (ctx.join, ctx.writer):
                rc = pipe.stop(worker)
                assert rc == 0, f"{worker.role} exited rc={rc}:\n{worker.log()[-3000:]}"
        finally:
            pipe.stop_all()
        snapshot = read_snapshot(env)
    finally:
        fault.close()
    return RunResult(fault.name, snapshot, ctx.producer.acked, traffic.requests, time.monotonic() - t0, ctx.observed)


def _start(settings: Any, pipe: Pipeline, traffic: FaultTraffic, fault: Fault) -> RunContext:
    writer = pipe.start("writer", free_port())
    join = pipe.start("join", free_port())
    pipe.wait_healthy(writer, timeout=180)
    pipe.wait_healthy(join, timeout=180)
    topic = settings.topic("stage-events")
    producer = PacedProducer(settings.kafka_bootstrap, topic, traffic.messages, fault.chunk, fault.pause_s)
    ctx = RunContext(settings, pipe, join, writer, producer, traffic)
    if fault.max_ahead is not None:
        limit = fault.max_ahead

        def hold(acked: int) -> bool:
            consumed = ctx.metrics(ctx.join).get("ttft_events_consumed_total")
            return consumed is not None and acked - consumed > limit

        producer.hold = hold
    producer.start()
    return ctx


def _trigger(ctx: RunContext, fault: Fault, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    join: dict[str, float] = {}
    writer: dict[str, float] = {}
    while time.monotonic() < deadline:
        join, writer = ctx.metrics(ctx.join), ctx.metrics(ctx.writer)
        if join and writer and fault.armed(ctx, join, writer):
            merged = {**writer, **{k: v for k, v in join.items() if v}}
            ctx.observed["at_trigger"] = {"produced": ctx.producer.acked, **{k: merged.get(k, 0.0) for k in WATCHED}}
            fault.inject(ctx)
            return
        time.sleep(POLL_S)
    raise AssertionError(f"fault {fault.name} never triggered; join={join} writer={writer}")


def _watch_premature_close(ctx: RunContext) -> None:
    """Record when the writer's watermark first passes the end of the traffic (every window closes), and
    whether the join still had events to process then: windows closed before their records were in."""
    s = ctx.settings
    window_ms = s.windows.window_s * 1000
    closes_at = (ctx.traffic.end_ms - 1) // window_ms * window_ms + window_ms + s.windows.grace_s * 1000
    while True:
        done = "drained_s" in ctx.observed
        mark = ctx.metrics(ctx.writer).get("ttft_writer_watermark_ms", 0.0)
        if mark >= closes_at:
            join = ctx.metrics(ctx.join)
            try:
                lag = ctx.join_lag()
            except Exception as exc:  # diagnostics only
                lag = -1
                ctx.observed["watch_error"] = repr(exc)
            ctx.observed["all_windows_closed"] = {
                "join_lag": lag,
                "join_open_requests": join.get("ttft_open_requests", -1.0),
                "produced": ctx.producer.acked,
                "premature": lag != 0 or ctx.producer.acked < len(ctx.traffic.messages),
            }
            return
        if done:
            return
        time.sleep(0.5)


#: Windows after the traffic's end the rules must have judged before a run stops: silence fires after 5
#: empty windows and stale alerts resolve after 10, so every run ends with the same transitions.
TRAILING_WINDOWS = 15


def _wait_drained(ctx: RunContext, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    horizon = ctx.traffic.end_ms + TRAILING_WINDOWS * ctx.settings.windows.window_s * 1000
    status: dict[str, float] = {}
    while time.monotonic() < deadline:
        join, writer = ctx.metrics(ctx.join), ctx.metrics(ctx.writer)
        status = {
            "open_requests": join.get("ttft_open_requests", -1.0),
            "open_windows": writer.get("ttft_open_windows", -1.0),
            "windows_closed": writer.get("ttft_windows_closed_total", 0.0),
            "watermark_ms": writer.get("ttft_writer_watermark_ms", 0.0),
        }
        if (
            status["open_requests"] == 0
            and status["open_windows"] == 0
            and status["windows_closed"] > 0
            and status["watermark_ms"] >= horizon
        ):
            status["join_lag"] = ctx.join_lag()
            status["writer_lag"] = ctx.writer_lag()
            if status["join_lag"] == 0 and status["writer_lag"] == 0:
                return
        time.sleep(0.5)
    logs = "\n".join(f"--- {w.role}:{w.port}\n{w.log()[-2000:]}" for w in ctx.pipe.workers)
    raise AssertionError(f"the pipeline did not drain in {timeout}s: {status}\n{logs}")


class FaultLab:
    """Runs the reference and the selected faults over one traffic, ``lanes`` runs at a time.

    Most of a fault run is waiting (outages, restarts, the idle close at the end), so runs overlap in
    background threads; :meth:`result` waits for one. Each run has its own topics, store and home.
    """

    def __init__(self, traffic: FaultTraffic, bootstrap: str, homes: Any, lanes: int = 2) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.traffic, self.bootstrap, self.homes = traffic, bootstrap, homes
        self.pool = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="fault-lane")
        self.futures: dict[str, Any] = {}

    def start(self, name: str, fault: Fault | None) -> None:
        """Schedule one run (``fault=None``: the reference), in call order."""
        home = self.homes(name)
        self.futures[name] = self.pool.submit(run, self.traffic, fault, bootstrap=self.bootstrap, home=home)

    def result(self, name: str, timeout: float = 1_800.0) -> RunResult:
        """The finished run (re-raises what failed it)."""
        result: RunResult = self.futures[name].result(timeout=timeout)
        return result

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


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
    """``{"topic:partition": committed offset}`` of a consumer group."""
    return asyncio.run(_committed(bootstrap, group))


if __name__ == "__main__" and sys.argv[1:] == ["snapshot"]:
    print(json.dumps(_query_snapshot(), ensure_ascii=False))
    exit_process(0)
