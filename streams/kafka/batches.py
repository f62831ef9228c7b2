"""One partition-batch runner for every role: consume a fetch → fold → produce → state → commit.

The join, the OTLP bridge and the store writer are each a *fold* (:class:`BatchFold`) run by one
:class:`PartitionBatchRunner`, which owns the aiokafka group consumer, the producer and the order in which
things become durable. Per fetch:

1. ``getmany`` returns up to ``batch_max`` records; nothing is committed yet (auto-commit is off).
2. The fold (a Faust agent under ``ttft worker``, see :mod:`streams.app.agents`) folds the records of the
   partitions it owns, advances the partitions that are idle, and appends what it emits to ``outputs``.
3. The outputs are produced, one producer batch per target partition, and **awaited** (through a broker
   outage of any length: :mod:`streams.kafka.produce`).
4. When a checkpoint is due (every ``state_every_ms``, or once ``state_every_events`` were folded since
   the last one), the fold's dirty state goes to its compacted changelog and is **awaited**.
5. Only then are the offsets of every fetch folded up to that checkpoint committed.

With ``pipelined``, steps 3-5 of fetch N (its *completion*) run while fetch N+1 is folded; at most one
completion is in flight and the next starts after it ended, so records, state and offsets keep their order
across fetches. Anything that raises in a step or a completion ends the process at once with nothing of it
(or later) committed, so a restart replays it from the committed offsets (:func:`exit_uncommitted`).

Ownership: on assignment the new partitions are paused and the fold restores their state before any of
their records is folded (records fetched before the pause are sought back, never folded, never skipped);
a restore that raises ends the process uncommitted (aiokafka would swallow it and leave the partitions
paused). On revocation the in-flight completion finishes, a checkpoint is written and committed while
the partitions are still ours, then the fold drops their state. A stop does the same, bounded in time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from streams.kafka.positions import fetched_position
from streams.kafka.produce import produce_batches
from streams.kafka.topics import ensure_named_topics, kafka_client_kwargs
from streams.kafka.unreadable import UNREADABLE_ERRORS, salvage
from streams.settings import Settings

log = logging.getLogger("ttft.runner")

#: A batch that failed (its process exits; a restart replays it from the committed offsets).
EXIT_BATCH_FAILED = 1
#: A fold halted ingestion on purpose (:class:`IngestHalted`; its page was produced first).
EXIT_INGEST_HALTED = 3

#: A partition counts as caught up only while the broker answers its fetches: aiokafka asks again every
#: ``fetch_max_wait_ms`` (0.5 s) when there is nothing new, so 5 s without an answer means the broker or the
#: network is gone. A broker restart seen as silence moved the watermarks by the outage: an OTLP trace held
#: for its root was resolved without it, and its spans that named no tenant were dead-lettered.
FETCH_FRESH_MS = 5_000.0

#: How long a stop waits for the last completion (records, state, commit) before leaving it uncommitted.
SETTLE_AT_STOP_S = 30.0

#: A changelog keeps close to its live keys: compacted, with segments closed every 10 minutes so
#: compaction can reach them, which bounds the restore after a rebalance.
CHANGELOG_CONFIGS: dict[str, str] = {
    "cleanup.policy": "compact",
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
}

Key = bytes | None
#: (topic, partition) -> [(key, value)], in production order.
Outputs = dict[tuple[str, int], list[tuple[Key, bytes | None]]]
Records = Mapping[TopicPartition, Sequence[ConsumerRecord[Any, Any]]]
#: Publishes a fold's gauges and counters (:meth:`BatchFold.report`).
Report = Callable[[], None]
#: route(key, source partition, the topic's partitions) -> the target partition.
Route = Callable[[Key, int, Sequence[int]], int]


def by_source(key: Key, source: int, partitions: Sequence[int]) -> int:
    """The source partition's share of the target topic: no per-message partitioner."""
    return partitions[source % len(partitions)]


_default_partitioner = DefaultPartitioner()
#: (key, partitions) -> partition: a request's events share their key, and aiokafka's murmur2 is pure Python
#: (about a tenth of the OTLP bridge's CPU per span uncached). Cleared when full.
_by_key_cache: dict[tuple[Key, tuple[int, ...]], int] = {}
_BY_KEY_CACHE_MAX = 100_000


def by_key(key: Key, source: int, partitions: Sequence[int]) -> int:
    """What a producer keyed by ``key`` would pick (murmur2), as the services' emitters do."""
    ps = partitions if type(partitions) is tuple else tuple(partitions)
    found = _by_key_cache.get((key, ps))
    if found is None:
        if len(_by_key_cache) >= _BY_KEY_CACHE_MAX:
            _by_key_cache.clear()
        found = _by_key_cache[(key, ps)] = int(_default_partitioner(key, list(ps), list(ps)))
    return found


class Emit:
    """Where a fold puts what it emits: routed to a partition of its topic, in order."""

    def __init__(self, outputs: Outputs, partitions: Mapping[str, Sequence[int]], routes: Mapping[str, Route]) -> None:
        self.outputs = outputs
        self.partitions = partitions
        self.routes = routes

    def __call__(self, topic: str, key: Key, value: bytes, source: int) -> None:
        partitions = self.partitions[topic]
        self.outputs[(topic, self.routes.get(topic, by_source)(key, source, partitions))].append((key, value))

    def everywhere(self, topic: str, key: Key, value: bytes) -> None:
        """One copy on every partition of ``topic`` (watermark heartbeats)."""
        for partition in self.partitions[topic]:
            self.outputs[(topic, partition)].append((key, value))


class PartitionView(Protocol):
    """What a fold may ask the runner about its partitions while it folds."""

    owned: set[TopicPartition]

    def idle(self, tp: TopicPartition) -> bool: ...

    def unread_backlog(self, tp: TopicPartition) -> bool: ...

    def lag(self, tp: TopicPartition) -> int | None: ...


class BatchFold(Protocol):
    """A role's pure work on a fetch, adapted to the runner (the join, the OTLP mapping, the writer)."""

    async def fold(self, records: Records, now_ms: float, view: PartitionView, emit: Emit) -> None:
        """Fold ``records`` (owned partitions only, in offset order), advance what may move, emit outputs.
        May raise :class:`IngestHalted`; any other exception ends the process uncommitted."""

    def take_dirty(self) -> Outputs:
        """The state writes (changelog topic, partition) -> [(key, packed or None)] since the last call."""

    async def restore(self, partitions: list[TopicPartition]) -> None:
        """Load the state of newly owned partitions (before any of their records is folded)."""

    def revoke(self, partitions: set[TopicPartition]) -> None:
        """Forget the state of partitions that are no longer ours."""

    def report(self) -> Report:
        """Called right after each fold: what to publish once everything that fold emitted is acknowledged.
        Gauges are read now, not then: pipelined, fetch N+1 is folded before fetch N's completion ends, and
        a request it released is neither open nor produced yet. Read at N's end, ``ttft_open_requests``
        would say 0 while that request's record is still unproduced, and a drain check (the tests, ``ttft
        replay``) would stop the writer before it arrives."""


class IngestHalted(Exception):
    """Raised out of a fold when ingestion must stop: the runner pages ``(topic, key, value)``, then exits."""

    def __init__(self, topic: str, key: bytes, value: bytes) -> None:
        super().__init__("ingest halted")
        self.topic, self.key, self.value = topic, key, value


@dataclass(frozen=True)
class RunnerConfig:
    """One role's consumer, producer and checkpoint settings."""

    name: str
    group_id: str
    topics: tuple[str, ...]
    #: Topics the fold emits to (their partition lists are looked up at start), and how each is routed.
    output_topics: tuple[str, ...] = ()
    routes: Mapping[str, Route] = field(default_factory=dict)
    #: The fold's compacted changelog (created at start when missing), if it keeps state.
    changelog: str | None = None
    #: The changelog's partitions when not ``settings.partitions`` (grown at start when it has fewer).
    changelog_partitions: int | None = None
    batch_max: int = 10_000
    poll_ms: int = 200
    #: Keep polling this long after the first records of a fetch (one store insert for what arrives together).
    linger_ms: int = 0
    fetch_max_bytes: int = 16 * 1_048_576
    max_partition_fetch_bytes: int = 2 * 1_048_576
    max_poll_interval_ms: int = 300_000
    #: Checkpoint (state, then offsets) at most this often (0: after every fetch), or once this many events
    #: were folded since the last one (None: no count).
    state_every_ms: float = 0.0
    state_every_events: int | None = None
    #: The completion of fetch N runs while fetch N+1 is folded.
    pipelined: bool = False
    #: The fold keeps per-partition state: pause and restore on assignment, fold owned partitions only.
    owns_partitions: bool = True


@dataclass
class RunnerMetrics:
    """The counters a runner keeps for its role (any may be None)."""

    consumed: Any = None
    acked: Any = None
    unacked: Any = None
    batches: Any = None
    lag: Any = None
    #: Producer batches the broker refused with a retriable error (sent again), streams.kafka.produce.
    refused: Any = None
    health: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """One fetch on its way through the fold (a Faust agent under ``ttft worker``)."""

    records: Records
    now_ms: float
    view: PartitionView
    emit: Emit
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


#: Hands a step to its fold and waits until the fold finished it (the Faust agent, or the fold itself).
Submit = Callable[[Step], Awaitable[None]]


async def fold_step(fold: BatchFold, step: Step) -> None:
    """Run one step through ``fold`` and resolve it; never raises (the error goes to the step's waiter)."""
    try:
        await fold.fold(step.records, step.now_ms, step.view, step.emit)
    except BaseException as exc:
        if not step.done.done():
            step.done.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
    else:
        if not step.done.done():
            step.done.set_result(None)


@dataclass
class Completion:
    """What folded fetches still owe: their outputs, the state, then their offsets."""

    outputs: Outputs = field(default_factory=lambda: defaultdict(list))
    state: Outputs = field(default_factory=dict)
    commits: dict[TopicPartition, int] = field(default_factory=dict)
    events: int = 0
    #: The fold's report as of the last fold this completion covers (published once it is acknowledged).
    report: Report | None = None

    def owes(self) -> bool:
        return bool(self.outputs or self.state or self.commits)


def exit_uncommitted(what: str) -> None:
    """End the process now, with nothing of the failed batch (or any later one) committed."""
    log.critical("%s; exiting so a restart replays it", what, exc_info=True)
    sys.stderr.flush()
    os._exit(EXIT_BATCH_FAILED)


class PartitionBatchRunner:
    """Runs one :class:`BatchFold` on one consumer group (see the module docstring for the order)."""

    def __init__(
        self,
        settings: Settings,
        config: RunnerConfig,
        fold: BatchFold,
        *,
        metrics: RunnerMetrics | None = None,
        submit: Submit | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        fault_injector: Callable[[Outputs], None] | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.fold = fold
        self.metrics = metrics or RunnerMetrics()
        self._submit: Submit = submit or (lambda step: fold_step(fold, step))
        self._wall = wall_clock
        self._clock = monotonic
        #: Test hook: sees every produce first, may raise (``TTFT_FAULT_PRODUCE_FAIL_FILE``).
        self._fault = fault_injector
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.partitions: dict[str, tuple[int, ...]] = {}
        self.owned: set[TopicPartition] = set()
        #: Per owned partition, the next offset to fold: the group's committed offset at assignment, then
        #: one past the last record folded. Compared with the high watermark to tell an idle partition.
        self._next: dict[TopicPartition, int] = {}
        self._lag: dict[TopicPartition, int] = {}
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._inflight: asyncio.Future[None] | None = None
        self._deferred: dict[TopicPartition, int] = {}
        self._deferred_events = 0
        self._unacked = 0
        self._last_state_ms = 0.0
        #: Seconds the latest poll waited for messages (the writer's idle clock counts only these).
        self.last_poll_s = 0.0
        #: Whether the broker answered the fetches of every assigned partition lately when the latest poll
        #: returned (:meth:`answering`); the writer's idle clock restarts when it did not.
        self.last_poll_answered = True
        #: When the latest step began (the runner's monotonic clock), and whether the one before it began
        #: more than FETCH_FRESH_MS earlier: the runner was stalled (a produce waiting out a broker outage,
        #: the host starved) and saw nothing of its partitions meanwhile, so none of them is idle this step.
        self._step_began: float | None = None
        self._stalled = False
        self._readers: dict[str, Any] = {}

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the changelog if needed, start the producer, subscribe the group consumer."""
        s, c = self.settings, self.config
        client = kafka_client_kwargs(s)
        if c.changelog is not None:
            await ensure_named_topics(s, {c.changelog: CHANGELOG_CONFIGS}, partitions=c.changelog_partitions)
        if c.output_topics or c.changelog is not None:
            self.producer = AIOKafkaProducer(
                acks="all", linger_ms=5, max_batch_size=1_048_576, max_request_size=4_194_304, **client
            )
            await self.producer.start()
            for topic in c.output_topics:
                self.partitions[topic] = tuple(sorted(await self.producer.partitions_for(topic)))
        session_ms = int(s.session_timeout_s * 1000)
        self.consumer = AIOKafkaConsumer(
            group_id=c.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=c.batch_max,
            fetch_max_bytes=c.fetch_max_bytes,
            max_partition_fetch_bytes=c.max_partition_fetch_bytes,
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=1000,
            rebalance_timeout_ms=max(session_ms, 10_000),
            max_poll_interval_ms=c.max_poll_interval_ms,
            # A transactional producer's aborted records are never read, its open transaction is waited for.
            isolation_level="read_committed",
            **client,
        )
        self.consumer.subscribe(list(c.topics), listener=_Rebalance(self))
        await self.consumer.start()
        if not c.owns_partitions:
            self.metrics.health["status"] = "ok"

    async def run(self, *, close: bool = True) -> None:
        """Fetch, fold, produce and commit until :meth:`stop`; a failing step ends the process uncommitted.
        ``close``: leave the group at the end (the writer leaves it after its own stop hooks)."""
        assert self.consumer is not None
        c = self.config
        try:
            while not self._stopping.is_set():
                started = self._clock()
                try:
                    batch = await self.consumer.getmany(timeout_ms=c.poll_ms, max_records=c.batch_max)
                    if batch and c.linger_ms > 0:
                        batch = await self._linger(batch)
                except UNREADABLE_ERRORS as exc:  # a record the client cannot parse: read around it
                    log.error("%s: a fetched record cannot be read (%s); reading each partition alone", c.name, exc)
                    batch = await salvage(self.consumer, await self._folded_to(), c.poll_ms, c.batch_max)
                self.last_poll_s = max(0.0, self._clock() - started)
                self.last_poll_answered = self.answering()
                if self._stopping.is_set():
                    break  # fetched, not folded, not committed: the next owner reads it again
                async with self._lock:
                    try:
                        await self.step(batch)
                    except IngestHalted as halted:
                        await self._page_and_exit(halted)
                    except Exception:
                        exit_uncommitted(f"{c.name} batch failed")
        finally:
            try:
                async with self._lock:  # bounded: a stop with the broker gone must still end
                    await asyncio.wait_for(self.checkpoint(), SETTLE_AT_STOP_S)
            except Exception:  # nothing after the failed step was committed: the next owner re-reads it
                log.warning("%s: the last completion did not finish at stop", c.name, exc_info=True)
            if close:
                await self.close()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the step in flight (which is committed when it ends)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def close(self, timeout_s: float = 10.0) -> None:
        """Leave the group and flush the producer; bounded, so a stop with the broker gone still ends."""
        for reader in self._readers.values():
            try:
                await asyncio.wait_for(reader.stop(), timeout_s)
            except Exception:
                log.warning("closing the offset reader did not finish cleanly", exc_info=True)
        for client in (self.consumer, self.producer):
            if client is None:
                continue
            try:
                await asyncio.wait_for(client.stop(), timeout_s)
            except Exception:  # broker gone: nothing uncommitted is lost, the next owner re-reads it
                log.warning("closing %s did not finish cleanly", type(client).__name__, exc_info=True)

    async def _folded_to(self) -> dict[TopicPartition, int]:
        """Where each of this runner's partitions was folded to (else its committed offset, else its first)."""
        assert self.consumer is not None
        c = self.config
        out: dict[TopicPartition, int] = {}
        for tp in sorted(self.consumer.assignment()):
            if c.owns_partitions and tp not in self.owned:
                continue
            offset = self._next.get(tp)
            if offset is None:
                offset = await self.consumer.committed(tp)
            if offset is None:
                offset = (await self.consumer.beginning_offsets([tp]))[tp]
            out[tp] = offset
        return out

    async def _linger(self, batch: Records) -> dict[TopicPartition, list[ConsumerRecord[Any, Any]]]:
        """Poll on for up to ``linger_ms`` after the first records, while more arrive (up to ``batch_max``)."""
        assert self.consumer is not None
        merged = {tp: list(records) for tp, records in batch.items()}
        count = sum(len(records) for records in merged.values())
        deadline = self._clock() + self.config.linger_ms / 1000.0
        while count < self.config.batch_max and not self._stopping.is_set():
            remaining_ms = int((deadline - self._clock()) * 1000.0)
            if remaining_ms <= 0:
                break
            more = await self.consumer.getmany(timeout_ms=remaining_ms, max_records=self.config.batch_max - count)
            if not more:
                break
            for tp, records in more.items():
                merged.setdefault(tp, []).extend(records)
                count += len(records)
        return merged

    # --- one step ---------------------------------------------------------------------------------

    async def process(self, batch: Records) -> None:
        """Fold one fetch, produce its outputs, write the state and commit now (tests, tools)."""
        await self.step(batch, state_due=True)
        await self.settle()

    async def step(self, batch: Records, *, state_due: bool = False) -> None:
        """Fold one fetch (through the fold's agent), then complete it: awaited, or behind the next fold
        with ``pipelined``. ``state_due``: checkpoint now, whatever the interval."""
        c, m = self.config, self.metrics
        now = self._wall() * 1000.0
        began, self._step_began = self._step_began, self._clock()
        self._stalled = began is not None and (self._step_began - began) * 1000.0 > FETCH_FRESH_MS
        records: dict[TopicPartition, Sequence[ConsumerRecord[Any, Any]]] = {}
        events = 0
        for tp, items in batch.items():
            if not items:
                continue
            if c.owns_partitions and tp not in self.owned:
                self._refetch_later(tp, items[0].offset)
                continue
            records[tp] = items
            self._deferred[tp] = self._next[tp] = items[-1].offset + 1
            events += len(items)
        self._past_skipped_offsets()
        done = Completion()
        step = Step(records, now, self, Emit(done.outputs, self.partitions, c.routes))
        await self._submit(step)
        await step.done
        report = done.report = self.fold.report()
        self._deferred_events += events
        self._unacked += events
        if m.consumed is not None:
            m.consumed.inc(events)
        if events and m.batches is not None:
            m.batches.inc()
        if m.unacked is not None:
            m.unacked.set(self._unacked)
        if (
            state_due
            or now - self._last_state_ms >= c.state_every_ms
            or (c.state_every_events is not None and self._deferred_events >= c.state_every_events)
        ):
            self._take_checkpoint(done, now)
        await self.settle()
        if not done.owes():  # everything folded before is acknowledged, and this fold emitted nothing
            report()
            return
        if c.pipelined:
            self._inflight = asyncio.ensure_future(self._complete(done))
        else:
            await self._complete(done)

    async def settle(self) -> None:
        """Wait for the completion in flight; its error (if any) is raised here."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def checkpoint(self) -> None:
        """Settle, then write the state of everything folded and commit its offsets now (a revocation, a
        stop). The caller holds the lock."""
        await self.settle()
        done = Completion(report=self.fold.report())
        self._take_checkpoint(done, self._wall() * 1000.0)
        if done.owes():
            await self._complete(done)

    def _take_checkpoint(self, done: Completion, now_ms: float) -> None:
        self._last_state_ms = now_ms
        done.state = self.fold.take_dirty()
        done.commits, self._deferred = self._deferred, {}
        done.events, self._deferred_events = self._deferred_events, 0

    async def _complete(self, done: Completion) -> None:
        """Outputs, awaited; then the state, awaited; then the offsets are committed."""
        m = self.metrics
        if done.outputs:
            await self._produce(done.outputs)
        if done.state:
            await self._produce(done.state)
        if done.report is not None:
            done.report()
        if done.commits:
            assert self.consumer is not None
            await self.consumer.commit(done.commits)
            if m.acked is not None:
                m.acked.inc(done.events)
        self._unacked -= done.events
        if m.unacked is not None:
            m.unacked.set(self._unacked)
        self._update_lag(done.commits)

    async def _produce(self, outputs: Outputs) -> None:
        if self._fault is not None:
            self._fault(outputs)
        assert self.producer is not None, "this fold emitted outputs, but its runner has no output topics"
        await produce_batches(self.producer, outputs, counter=self.metrics.refused)

    def _refetch_later(self, tp: TopicPartition, offset: int) -> None:
        """Records of a partition whose state is not restored yet: never fold them, never skip them. The
        consumer's position already moved past them, so seek it back (the assignment pauses the partition
        until its state is restored; this covers records fetched before the pause took effect)."""
        assert self.consumer is not None
        if tp in self.consumer.assignment():
            self.consumer.seek(tp, offset)

    # --- what a fold may ask (PartitionView) ------------------------------------------------------

    def idle(self, tp: TopicPartition) -> bool:
        """Nothing left to fetch on ``tp``: its watermark may move on the wall clock. A partition with a
        backlog is never idle, or requests would be emitted before their events are read; nor is one the
        broker has not answered a fetch of for :data:`FETCH_FRESH_MS` (the broker down, the network cut):
        what waits there may be on its way; nor is any partition in the first step after the runner stalled
        for longer than that (it waited out a produce, say), since it saw nothing of what came meanwhile.
        (Never ``await consumer.position()`` here: it waits for the fetcher while a step holds the lock.)"""
        if self._stalled:
            return False
        end = self._end(tp)
        done = self._next.get(tp)
        if end is None:
            return True
        return done is not None and done >= end and self._fetched_lately(tp)

    def answering(self) -> bool:
        """The broker answered a fetch of every assigned partition within :data:`FETCH_FRESH_MS`: an empty poll
        now means nothing was sent, not that the broker could not be asked (a paused partition is not
        fetched, so it does not count as answered either)."""
        assert self.consumer is not None
        return all(self._fetched_lately(tp) for tp in self.consumer.assignment())

    def _fetched_lately(self, tp: TopicPartition) -> bool:
        """The broker answered a fetch of ``tp`` (records or none) within :data:`FETCH_FRESH_MS` (aiokafka's
        own clock, the wall clock); unknown counts as lately."""
        assert self.consumer is not None
        polled = self.consumer.last_poll_timestamp(tp)
        return polled is None or time.time() * 1000.0 - polled <= FETCH_FRESH_MS

    def unread_backlog(self, tp: TopicPartition) -> bool:
        """Records are known to wait on ``tp`` and none of them was folded yet."""
        end = self._end(tp)
        done = self._next.get(tp)
        return end is not None and done is not None and done < end

    def _end(self, tp: TopicPartition) -> int | None:
        """The offset after the last record the consumer may read on ``tp`` (read committed: the last stable
        offset, below an open transaction), as of its latest fetch; None before one."""
        assert self.consumer is not None
        lso = self.consumer.last_stable_offset(tp)
        end: int | None = lso if lso is not None else self.consumer.highwater(tp)
        return end

    def _past_skipped_offsets(self) -> None:
        """Move the folded-to offset of each owned partition past what the consumer skipped: transaction
        markers (control records no consumer receives) and aborted transactions' records. Without this a
        partition whose last offset is a marker never looks caught up, and its offset is never committed."""
        if self.consumer is None:
            return
        for tp in self.consumer.assignment():
            if self.config.owns_partitions and tp not in self.owned:
                continue
            position = fetched_position(self.consumer, tp)
            done = self._next.get(tp)
            if position is not None and (done is None or position > done):
                self._deferred[tp] = self._next[tp] = position

    def lag(self, tp: TopicPartition) -> int | None:
        return self._lag.get(tp)

    def _update_lag(self, commits: Mapping[TopicPartition, int]) -> None:
        assert self.consumer is not None
        for tp, offset in commits.items():
            end = self._end(tp)
            if end is not None:
                self._lag[tp] = max(0, end - offset)
                if self.metrics.lag is not None:
                    self.metrics.lag.labels(tp.topic, str(tp.partition)).set(self._lag[tp])

    async def _page_and_exit(self, halted: IngestHalted) -> None:
        """Produce the halt's alert (best effort, 10 s), then exit with nothing of the batch committed."""
        try:
            assert self.producer is not None
            fut = await self.producer.send(halted.topic, halted.value, key=halted.key)
            await asyncio.wait_for(fut, timeout=10)
        except Exception:  # the exit matters more than the page
            log.exception("could not produce the ingest-halted alert")
        sys.stderr.flush()
        os._exit(EXIT_INGEST_HALTED)

    # --- ownership --------------------------------------------------------------------------------

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """Restore the state of newly owned partitions before any of their records is folded."""
        if not self.config.owns_partitions:
            return
        new = sorted(partitions - self.owned)
        assert self.consumer is not None
        self.consumer.pause(*new)  # nothing of a partition is returned before its state is restored
        await self.fold.restore(new)
        for topic in {tp.topic for tp in new}:
            ps = [tp.partition for tp in new if tp.topic == topic]
            committed = await self._reader(topic).committed(ps)
            self._next.update({TopicPartition(topic, p): offset for p, offset in committed.items()})
        self.owned |= set(new)
        self.metrics.health["status"] = "ok"
        self.metrics.health["partitions"] = sorted(tp.partition for tp in self.owned)
        self.consumer.resume(*[tp for tp in new if tp in self.consumer.assignment()])

    def _reader(self, topic: str) -> Any:
        from streams.app.partition_reader import PartitionReader

        if topic not in self._readers:
            self._readers[topic] = PartitionReader(self.settings, topic, self.config.group_id)
        return self._readers[topic]

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        """Finish the completion in flight and commit what was folded, then drop the lost partitions."""
        async with self._lock:
            await self.checkpoint()  # the offsets folded are committed while the partitions are ours
            if not self.config.owns_partitions:
                return
            gone = partitions & self.owned
            self.fold.revoke(gone)
            self.owned -= gone
            for tp in gone:
                self._next.pop(tp, None)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka logs and swallows what a rebalance callback raises: here it ends the process instead."""

    def __init__(self, runner: PartitionBatchRunner) -> None:
        self.runner = runner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        try:
            await self.runner.revoked(set(revoked))
        except Exception:
            exit_uncommitted(f"{self.runner.config.name}: finishing the batch before a rebalance failed")

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            await self.runner.assigned(set(assigned))
        except Exception:
            exit_uncommitted(f"{self.runner.config.name}: restoring assigned partitions failed")
