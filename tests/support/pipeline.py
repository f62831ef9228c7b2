"""Run the real pipeline as subprocesses against the real broker and store, and read the results back.

The chDB store allows one process per data directory, so results are read by a separate process
(``tests/support/dump_store.py``) after the writer has exited.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from streams.ports import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProcess:
    role: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def metrics(self) -> dict[str, float]:
        """Prometheus text from /metrics, flattened to {name{labels}: value}."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
        return out

    def metric(self, name: str) -> float:
        """Sum of every sample whose name (without labels) is ``name``."""
        pattern = re.compile(rf"^{re.escape(name)}(\{{.*\}})?$")
        return sum(v for k, v in self.metrics().items() if pattern.match(k))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Pipeline:
    """Environment shared by the worker processes of one test."""

    env: dict[str, str]
    home: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    def start(
        self, role: str, port: int, worker_id: str | None = None, extra_env: dict[str, str] | None = None
    ) -> WorkerProcess:
        log_path = self.home / f"{role}-{port}.log"
        env = {**self.env, **(extra_env or {})}
        cmd = [
            sys.executable,
            "-m",
            "streams.cli.main",
            "worker",
            "--role",
            role,
            "--metrics-port",
            str(port),
            "--worker-id",
            worker_id or f"{role}-{port}",
        ]
        with log_path.open("ab") as log:
            proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        worker = WorkerProcess(role, proc, port, log_path)
        self.workers.append(worker)
        return worker

    def wait_healthy(self, worker: WorkerProcess, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.alive():
                raise AssertionError(f"{worker.role} exited rc={worker.proc.returncode}:\n{worker.log()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/healthz", timeout=1) as resp:
                    body = json.loads(resp.read())
                if body.get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{worker.role} not healthy in {timeout}s:\n{worker.log()[-4000:]}")

    def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return
            except OSError as exc:
                last = exc
            time.sleep(0.5)
        logs = "\n".join(f"--- {w.role}:{w.port}\n{w.log()[-3000:]}" for w in self.workers)
        raise AssertionError(f"timed out waiting for {what} (last={last!r})\n{logs}")

    def stop(self, worker: WorkerProcess, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if worker.alive():
            worker.proc.send_signal(sig)
        try:
            return worker.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            return worker.proc.wait(timeout=10)

    def stop_all(self) -> None:
        for w in self.workers:
            if w.alive():
                self.stop(w)

    def query(self, sql: str) -> list[dict[str, Any]]:
        """Run one SELECT on the store in a separate process (after the writer exited)."""
        out = subprocess.run(
            [sys.executable, str(REPO / "tests/support/dump_store.py"), sql],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            raise AssertionError(f"store query failed: {out.stderr.decode()[-3000:]}")
        return [json.loads(line) for line in out.stdout.decode().splitlines() if line]


def pipeline_env(settings: Any, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    env.update(
        TTFT_HOME=str(home),
        TTFT_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        TTFT_TOPIC_PREFIX=settings.topic_prefix,
        TTFT_APP_ID=f"app-{settings.topic_prefix}",
        TTFT_PARTITIONS=str(settings.partitions),
        TTFT_SESSION_TIMEOUT_S="6",
        TTFT_WINDOWS__IDLE_CLOSE_S="8",
        # The writer's read-only HTTP interface on a free port, never the shared default 8123.
        TTFT_STORE__HTTP_PORT=str(free_port()),
        # Alerts link to this checkout's runbook, as a deployment links to where it serves it.
        TTFT_RULES__RUNBOOK_BASE_URL=(REPO / "docs" / "runbook.md").as_uri(),
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


async def produce(bootstrap: str, topic: str, messages: Iterable[tuple[bytes | None, bytes]]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks="all")
    await producer.start()
    n = 0
    try:
        pending = []
        for key, value in messages:
            pending.append(await producer.send(topic, value=value, key=key))
            n += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return n


def produce_sync(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes]]) -> int:
    return asyncio.run(produce(bootstrap, topic, messages))


async def _group_lag(bootstrap: str, group: str, topics: Sequence[str]) -> int:
    """Messages not yet committed by ``group`` on ``topics`` (end offset - committed offset, summed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        described = await admin.describe_topics(list(topics))
        tps = [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]
        if len(tps) < len(topics):
            raise OSError(f"topic metadata incomplete for {topics}")
        ends = await consumer.end_offsets(tps)
        lag = 0
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            lag += max(0, ends[tp] - done)
        return lag
    finally:
        await consumer.stop()
        await admin.close()


def group_lag(bootstrap: str, group: str, topics: Sequence[str]) -> int:
    return asyncio.run(_group_lag(bootstrap, group, topics))


async def topic_partitions(bootstrap: str, topic: str) -> list[Any]:
    """The ``TopicPartition`` of every partition of ``topic``, as the broker describes it."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return [TopicPartition(topic, p["partition"]) for d in described for p in d["partitions"]]


async def read_topic(bootstrap: str, topic: str, timeout_ms: int = 3_000) -> list[tuple[bytes | None, bytes]]:
    """Every (key, value) currently in ``topic``, read without a consumer group."""
    return [(key, value) for _, key, value in await read_topic_partitions(bootstrap, topic, timeout_ms)]


async def read_topic_partitions(
    bootstrap: str, topic: str, timeout_ms: int = 3_000
) -> list[tuple[int, bytes | None, bytes]]:
    """Every (partition, key, value) currently in ``topic``, each partition's in offset order."""
    from aiokafka import AIOKafkaConsumer

    tps = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[int, bytes | None, bytes]] = []
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_ms / 1000.0 + 10
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                out += [(m.partition, m.key, m.value) for m in messages if m.value is not None]
    finally:
        await consumer.stop()
    return out


def pipeline_drained(settings: Any, join: WorkerProcess) -> bool:
    """Every produced event committed by the join, nothing open, every record and dead letter committed by the
    writer."""
    app, b = f"app-{settings.topic_prefix}", settings.kafka_bootstrap
    return (
        group_lag(b, f"{app}-join", [settings.topic("stage-events")]) == 0
        and join.metric("ttft_open_requests") == 0
        and group_lag(b, f"{app}-writer", [settings.topic("requests"), settings.topic("dead-letter")]) == 0
    )
