"""``ttft replay``: re-process history into the same tables, idempotently, with paging muted.

A replay runs a fresh join (its own consumer group and state, ``<app_id>-replay-<stamp>``) from a point in
``ttft.stage-events`` up to the end offsets seen when it started, and a writer that reads only what the
replay produces. Every table it writes is idempotent (``requests`` keeps one row per request id, the
aggregates one row per window key, alerts one row per transition), so replaying a range that is already
stored changes nothing, and replaying after a store loss rebuilds it.

With the embedded chDB store, stop the live writer first (one process per data directory) or use
``--join-only`` and let the live writer absorb the re-emitted records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from streams.alerting.outbox import topic_partitions
from streams.kafka.topics import kafka_client_kwargs
from streams.ports import free_port
from streams.settings import Settings


@dataclass(frozen=True)
class ReplayPlan:
    """Where a replay starts and stops, per partition of ``ttft.stage-events``."""

    app_id: str
    start: dict[int, int]
    end: dict[int, int]

    @property
    def events(self) -> int:
        return sum(max(0, self.end[p] - self.start[p]) for p in self.start)


async def plan_replay(
    settings: Settings, *, from_time_ms: int | None, from_offset: int | None, app_id: str
) -> ReplayPlan:
    """Resolve the start offsets and commit them (and the writer's start) for the replay's groups."""
    topic = settings.topic("stage-events")
    kwargs = kafka_client_kwargs(settings)
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **kwargs)
    await consumer.start()
    try:
        parts = await topic_partitions(settings, topic)
        tps = [TopicPartition(topic, p) for p in parts]
        end = await consumer.end_offsets(tps)
        begin = await consumer.beginning_offsets(tps)
        start: dict[int, int] = {}
        if from_time_ms is not None:
            found = await consumer.offsets_for_times({tp: from_time_ms for tp in tps})
            for tp in tps:
                hit = found.get(tp)
                start[tp.partition] = hit.offset if hit is not None else end[tp]
        else:
            for tp in tps:
                start[tp.partition] = max(begin[tp], min(int(from_offset or 0), end[tp]))
        await _commit(settings, f"{app_id}-join", {TopicPartition(topic, p): o for p, o in start.items()})
        writer_tps: dict[TopicPartition, int] = {}
        for name in ("requests", "dead-letter"):
            wt = settings.topic(name)
            wtps = [TopicPartition(wt, p) for p in await topic_partitions(settings, wt)]
            writer_tps.update(await consumer.end_offsets(wtps))
        await _commit(settings, f"{app_id}-writer", writer_tps)
        return ReplayPlan(app_id, start, {tp.partition: end[tp] for tp in tps})
    finally:
        await consumer.stop()


async def _commit(settings: Settings, group: str, offsets: dict[TopicPartition, int]) -> None:
    consumer = AIOKafkaConsumer(group_id=group, enable_auto_commit=False, **kafka_client_kwargs(settings))
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
    finally:
        await consumer.stop()


async def _group_done(settings: Settings, group: str, targets: dict[TopicPartition, int]) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**kafka_client_kwargs(settings))
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return all((committed.get(tp) or OffsetAndMetadata(-1, "")).offset >= off for tp, off in targets.items())


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def run_replay(
    settings: Settings,
    plan: ReplayPlan,
    *,
    join_only: bool = False,
    timeout_s: float = 3600.0,
    progress: Callable[[str], None] = print,
) -> int:
    """Run the replay's workers until the planned range is processed and written; returns an exit code."""
    env = {
        **os.environ,
        "TTFT_APP_ID": plan.app_id,
        "TTFT_PAGING_MUTED": "true",
        "TTFT_REPLAY": "true",
        "TTFT_ALERTMANAGER_URL": "",
    }
    roles = ["join"] if join_only else ["writer", "join"]
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for role in roles:
            port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "streams.cli.main",
                "worker",
                "--role",
                role,
                "--worker-id",
                f"{plan.app_id}-{role}",
                "--metrics-port",
                str(port),
            ]
            procs[role] = (subprocess.Popen(cmd, env=env), port)
        topic = settings.topic("stage-events")
        targets = {TopicPartition(topic, p): o for p, o in plan.end.items()}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for role, (proc, _) in procs.items():
                if proc.poll() is not None:
                    progress(f"replay: {role} worker exited with {proc.returncode}")
                    return proc.returncode or 1
            try:
                done = asyncio.run(_group_done(settings, f"{plan.app_id}-join", targets))
                join_port = procs["join"][1]
                settled = done and _metric(join_port, "ttft_open_requests") == 0
                if settled and not join_only:
                    settled = (
                        _metric(procs["writer"][1], "ttft_unacked_records") == 0
                        and _writer_caught_up(settings, plan.app_id)
                        and _metric(procs["writer"][1], "ttft_open_windows") == 0
                    )
            except OSError:
                settled = False
            if settled:
                progress(f"replay: {plan.events} events re-processed")
                return 0
            time.sleep(1.0)
        progress("replay: timed out")
        return 1
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _writer_caught_up(settings: Settings, app_id: str) -> bool:
    async def check() -> bool:
        consumer = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings))
        await consumer.start()
        try:
            tps = []
            for name in ("requests", "dead-letter"):
                topic = settings.topic(name)
                tps += [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        return await _group_done(settings, f"{app_id}-writer", ends)

    return asyncio.run(check())
