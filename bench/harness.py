"""What every measurement shares: one real broker, one settings object per phase, Kafka offset reads.

Each phase gets its own topic prefix and ``TTFT_HOME`` (so its own chDB store and worker data), on the
one broker the run started. Worker processes are started through :class:`tests.support.pipeline.Pipeline`,
the same launcher the end-to-end tests use.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.kafka.broker import LocalBroker
from streams.kafka.topics import ensure_topics, kafka_client_kwargs
from streams.ports import free_port
from streams.settings import TOPIC_NAMES, Settings
from streams.sim.produce import ProduceReport, produce_messages
from streams.sim.scenarios import DEFAULT_TENANTS
from streams.sim.traffic import Message
from tests.support.pipeline import Pipeline, WorkerProcess, pipeline_env

__all__ = ["BenchEnv", "Offsets", "free_port", "poll_until", "poll_until_async"]


#: Every tenant the phases send (the simulator's, the close burst's, the OTel service's), registered as a
#: deployment lists its tenants: otherwise, with registration on by default, they would share the pool of
#: unregistered tenants (20,000 open requests in all) until steady, and the memory phase's 100,000 open
#: requests could never be held.
BENCH_TENANTS: tuple[str, ...] = (*DEFAULT_TENANTS, "t0", "t1", "t2", "t3", "tenant-0", "tenant-1")


@dataclass
class BenchEnv:
    """The broker and scratch directory of one run; hands out per-phase settings and launchers."""

    broker: LocalBroker
    root: Path
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    pipelines: list[Pipeline] = field(default_factory=list)
    #: Environment of every worker of every phase (``--worker-env``), e.g. ``TTFT_JOIN__BATCH_MAX``.
    worker_env: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def settings(self, phase: str, **overrides: Any) -> Settings:
        """Settings of one phase: its own prefix, home and app id; topics not created yet."""
        prefix = f"b{self.run_id}-{phase}"
        home = self.root / phase
        home.mkdir(parents=True, exist_ok=True)
        return Settings(
            home=home,
            kafka_bootstrap=self.bootstrap,
            topic_prefix=prefix,
            app_id=f"app-{prefix}",
            **overrides,
        )

    def create_topics(self, settings: Settings, names: Iterable[str] = TOPIC_NAMES) -> None:
        asyncio.run(ensure_topics(settings, list(names)))

    def pipeline(self, settings: Settings, **extra_env: str) -> Pipeline:
        """A launcher for ``ttft worker`` processes of this phase (stopped by :meth:`stop_all`)."""
        env = {"TTFT_TENANCY__REGISTERED": ",".join(BENCH_TENANTS), **self.worker_env, **extra_env}
        pipe = Pipeline(pipeline_env(settings, settings.home, **env), settings.home)
        self.pipelines.append(pipe)
        return pipe

    def start_worker(self, pipe: Pipeline, role: str, timeout: float = 120.0) -> WorkerProcess:
        worker = pipe.start(role, free_port())
        pipe.wait_healthy(worker, timeout=timeout)
        return worker

    def stop_all(self) -> None:
        for pipe in self.pipelines:
            pipe.stop_all()


def poll_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Call ``predicate`` until it is true; returns the wall time (``time.time()``) it first was.

    An ``OSError`` (a worker's /metrics slow to answer on a busy machine) counts as "not yet".
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return time.time()
        except OSError:
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def produce(settings: Settings, topic: str, messages: Sequence[Message]) -> ProduceReport:
    """Pre-produce ``messages`` as fast as the broker takes them (the simulator's batch producer)."""
    return asyncio.run(produce_messages(messages, topic=topic, client_kwargs=kafka_client_kwargs(settings)))


class Offsets:
    """One admin client and one consumer kept open for repeated offset reads while a phase runs."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._tps: dict[str, list[TopicPartition]] = {}

    async def __aenter__(self) -> Offsets:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def partitions(self, topic: str) -> list[TopicPartition]:
        if topic not in self._tps:
            self._tps[topic] = await topic_partitions(self.admin, topic)
        return self._tps[topic]

    async def ends(self, topics: Sequence[str]) -> dict[TopicPartition, int]:
        """Log-end offset of every partition of ``topics``."""
        tps = [tp for t in topics for tp in await self.partitions(t)]
        ends: dict[TopicPartition, int] = await self.consumer.end_offsets(tps)
        return ends

    async def committed(self, group: str) -> dict[TopicPartition, int]:
        """The offsets ``group`` committed (absent: nothing committed yet)."""
        raw = await self.admin.list_consumer_group_offsets(group)
        return {tp: meta.offset for tp, meta in raw.items() if meta is not None and meta.offset >= 0}

    async def lag(self, group: str, topics: Sequence[str]) -> int:
        """Messages of ``topics`` not yet committed by ``group``."""
        ends = await self.ends(topics)
        done = await self.committed(group)
        return sum(max(0, end - done.get(tp, 0)) for tp, end in ends.items())


async def topic_partitions(admin: AIOKafkaAdminClient, topic: str) -> list[TopicPartition]:
    """The partitions of ``topic`` from the broker's metadata (a group-less consumer has none cached)."""
    for entry in await admin.describe_topics([topic]):
        if entry.get("topic") == topic and entry.get("partitions"):
            return [TopicPartition(topic, p["partition"]) for p in sorted(entry["partitions"], key=_pid)]
    raise RuntimeError(f"topic {topic} has no partitions")


def _pid(p: dict[str, Any]) -> int:
    return int(p["partition"])


async def poll_until_async(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.1
) -> float:
    """Await ``predicate`` until it is true; returns the wall time (``time.time()``) it first was."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return time.time()
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def read_keys(
    bootstrap: str,
    starts: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
    timestamps: dict[tuple[int, int], int] | None = None,
) -> dict[tuple[int, int], bytes]:
    """``{(partition, offset): key}`` of the messages between ``starts`` and ``ends`` (exclusive); their
    Kafka timestamps (ms) go into ``timestamps`` when given."""

    async def run() -> dict[tuple[int, int], bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20
        )
        await consumer.start()
        out: dict[tuple[int, int], bytes] = {}
        try:
            wanted = [tp for tp in ends if ends[tp] > starts.get(tp, 0)]
            consumer.assign(wanted)
            for tp in wanted:
                consumer.seek(tp, starts.get(tp, 0))
            remaining = set(wanted)
            while remaining:
                batch = await consumer.getmany(timeout_ms=1_000, max_records=50_000)
                for tp, msgs in batch.items():
                    for msg in msgs:
                        if msg.offset < ends[tp] and msg.key is not None:
                            out[(tp.partition, msg.offset)] = msg.key
                            if timestamps is not None:
                                timestamps[(tp.partition, msg.offset)] = msg.timestamp
                    if msgs and msgs[-1].offset >= ends[tp] - 1:
                        remaining.discard(tp)
                        consumer.pause(tp)
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())
