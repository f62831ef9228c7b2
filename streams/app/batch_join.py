"""The join on its own aiokafka group consumer: whole fetches per step (``join.consumer: batch``).

What is durable when (the same order as the Faust adapter, per fetched batch rather than per event):

1. ``getmany`` returns thousands of records; nothing is committed yet (auto-commit is off).
2. Each record is decoded and folded by :class:`streams.core.join.RequestJoin`; bad ones become dead
   letters. Partitions without a backlog get the idle tick.
3. The records the core emitted and the dead letters are produced in one batch per target partition
   (explicit partition: the source partition, so no per-message partitioner) and **awaited**.
4. At most every ``join.state_every_ms``, or once ``join.batch_max`` events were folded since the last
   write (not with every fetch): one state write per request touched since the last one goes to the
   compacted changelog, batched and **awaited**.
5. Only then are the offsets of every fetch folded up to here committed.

Records leave with every fetch (at most ``join.batch_max`` events); the state and the commit follow on
their own cadence, so a request whose events span many fetches (live traffic: its stages arrive over
seconds) is written about once per interval, not once per fetch, and a smaller ``batch_max`` (a shorter
step, so less lag) costs no extra changelog writes. Measured at 20k ev/s offered on the 2-core machine,
2,000 events per fetch cost capacity (one of two runs fell behind), so 10,000 stays the default.

A crash between a fetch's records and the next state write replays those fetches from the committed
offsets: their records are emitted again and absorbed by the store, as with a crash between steps 3 and 5
of one fetch.

Steps 3-5 of one fetch (its *completion*) run while the next fetch is folded: the fold yields to the
event loop every ``FOLD_SLICE`` records, so the acknowledgements and the commit of batch N arrive during
the fold of N+1 instead of stalling it. At most one completion is in flight, and the next one starts only
after it ended, so records, state and offsets stay in that order across batches too. A completion that
fails ends the process before anything later is committed.

A crash before 5 replays the batch: the changelog state recognises the events already folded (by source
offset), and a record emitted twice is absorbed by the store. A batch that raises ends the process with
nothing committed. On revocation the in-flight batch is finished and committed before the partitions go;
on assignment their state is restored from the changelog before any of their records is fetched.

The consumer group and the changelog topic are the ones the Faust adapter used
(``{app_id}-join`` and ``{app_id}-join-join-state-changelog``), so switching resumes from the committed
offsets with the open requests intact.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition

from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from streams.app.join_changelog import restore_partitions
from streams.app.join_guard import halt_alert, report_quarantines, sync_counter
from streams.app.metrics import WorkerMetrics
from streams.app.partition_reader import PartitionReader
from streams.core.guard import DeadLetterGuard
from streams.core.join import RequestJoin
from streams.core.watermarks import WATERMARK_KEY
from streams.kafka.topics import ensure_named_topics, kafka_client_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.join")

JOIN_STATE_TABLE = "join-state"
HEARTBEAT_INTERVAL_MS = 500.0
EXIT_INGEST_HALTED = 3
EXIT_BATCH_FAILED = 1
_POLL_MS = 200
#: Records folded between two yields to the event loop (the in-flight completion progresses there).
FOLD_SLICE = 250
#: How long a stop waits for the last completion (records, state, commit) before leaving it uncommitted.
_SETTLE_AT_STOP_S = 30.0

#: The changelog keeps close to its live keys (open and remembered requests): compacted, with segments
#: closed every 10 minutes so compaction can reach them, which bounds the restore after a rebalance.
CHANGELOG_CONFIGS: dict[str, str] = {
    "cleanup.policy": "compact",
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
}

Key = bytes | None
#: (topic, partition) -> [(key, value)], in production order.
Outputs = dict[tuple[str, int], list[tuple[Key, bytes | None]]]


@dataclass
class Completion:
    """What one folded fetch still owes: its records (then heartbeats), its state, then its offsets."""

    outputs: Outputs = field(default_factory=lambda: defaultdict(list))
    state: Outputs = field(default_factory=lambda: defaultdict(list))
    #: The offsets of every fetch folded since the last commit, and how many events they cover.
    commits: dict[TopicPartition, int] = field(default_factory=dict)
    events: int = 0

    def owes(self) -> bool:
        return bool(self.outputs or self.state or self.commits)


def join_group_id(settings: Settings) -> str:
    """The join's consumer group: the id Faust gave the join app, so offsets carry over."""
    return f"{settings.app_id}-join"


def changelog_topic(settings: Settings) -> str:
    """The compacted topic of the join state (Faust's name for the ``join-state`` table's changelog)."""
    return f"{join_group_id(settings)}-{JOIN_STATE_TABLE}-changelog"


async def produce_batches(producer: AIOKafkaProducer, outputs: Outputs) -> None:
    """One producer batch per (topic, partition), all sent, then all acknowledgements awaited (explicit
    partitions: no per-message partitioner). Shared by the join and the OTLP bridge."""
    futures: list[asyncio.Future[Any]] = []
    for (topic, partition), items in outputs.items():
        batch = producer.create_batch()
        for key, value in items:
            if batch.append(key=key, value=value, timestamp=None) is None:
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise ValueError(f"a message for {topic}[{partition}] exceeds the producer's batch size")
        if batch.record_count():
            futures.append(await producer.send_batch(batch, topic, partition=partition))
    if futures:
        await asyncio.gather(*futures)


class BatchJoin:
    """Consume stage events in whole fetches, fold them, produce and commit (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        metrics: WorkerMetrics,
        *,
        wall_clock: Callable[[], float] = time.time,
        fault_injector: Callable[[Outputs], None] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._wall = wall_clock
        #: Test hook (``TTFT_FAULT_PRODUCE_FAIL_FILE``, streams/app/runner.py): sees every produce first, may raise.
        self._fault = fault_injector
        self.core = RequestJoin(settings.join, settings.windows.window_s * 1000)
        self.topic = settings.topic("stage-events")
        self.requests_topic = settings.topic("requests")
        self.dead_letter_topic = settings.topic("dead-letter")
        self.changelog = changelog_topic(settings)
        self.guard = DeadLetterGuard(
            settings.caps.halt_window_messages,
            settings.caps.halt_dead_letter_share,
            settings.caps.max_quarantined_tenants,
        )
        self.owned: set[int] = set()
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._last_heartbeat_ms = 0.0
        self._partitions: dict[str, int] = {}
        self._lag: dict[int, int] = {}
        #: Per owned partition, the next offset to fold: the group's committed offset at assignment, then
        #: one past the last record folded. Compared with the high watermark to tell an idle partition.
        self._next: dict[int, int] = {}
        self.reader = PartitionReader(settings, self.topic, join_group_id(settings))
        self._emitted_by_status: dict[str, Any] = {}  # status -> its records_emitted child
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        #: The previous fetch's completion while the next one is folded (at most one; see the docstring).
        self._inflight: asyncio.Future[None] | None = None
        self._unacked = 0
        #: Offsets folded but not committed yet (they wait for the next state write), and their events.
        self._deferred: dict[TopicPartition, int] = {}
        self._deferred_events = 0
        self._last_state_ms = 0.0
        metrics.health["status"] = "starting"

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the changelog if needed, start the producer, subscribe the group consumer."""
        s = self.settings
        await ensure_named_topics(s, {self.changelog: CHANGELOG_CONFIGS})
        client = kafka_client_kwargs(s)
        self.producer = AIOKafkaProducer(
            acks="all", linger_ms=5, max_batch_size=1_048_576, max_request_size=4_194_304, **client
        )
        await self.producer.start()
        for topic in (self.requests_topic, self.dead_letter_topic):
            self._partitions[topic] = len(await self.producer.partitions_for(topic))
        session_ms = int(s.session_timeout_s * 1000)
        self.consumer = AIOKafkaConsumer(
            group_id=join_group_id(s),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=s.join.batch_max,
            # A batch is join.batch_max events (10k ~ 4 MB): 16 MiB of prefetch keeps the consumer ahead
            # without holding 64 MiB of fetch buffers in every worker (RSS per open request, issue 13).
            fetch_max_bytes=16 * 1_048_576,
            max_partition_fetch_bytes=2 * 1_048_576,
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=1000,
            rebalance_timeout_ms=max(session_ms, 10_000),
            **client,
        )
        self.consumer.subscribe([self.topic], listener=_Rebalance(self))
        await self.consumer.start()

    async def run(self) -> None:
        """Fetch, process and commit until :meth:`stop`; a failing batch ends the process uncommitted."""
        assert self.consumer is not None
        try:
            while not self._stopping.is_set():
                batch = await self.consumer.getmany(timeout_ms=_POLL_MS, max_records=self.settings.join.batch_max)
                if self._stopping.is_set():
                    break  # fetched, not folded, not committed: the next owner reads it again
                async with self._lock:
                    try:
                        await self.step(batch)
                    except _Halted as halted:
                        await self._page_and_exit(halted)
                    except Exception:
                        _exit_uncommitted("join batch failed")
        finally:
            try:
                async with self._lock:  # bounded: a stop with the broker gone must still end
                    await asyncio.wait_for(self.write_state(), _SETTLE_AT_STOP_S)
            except Exception:  # nothing after the failed step was committed: the next owner re-reads it
                log.warning("the last batch's completion did not finish at stop", exc_info=True)
            await self._close()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the batch in flight (which is committed when it ends)."""
        self._stopping.set()

    async def _close(self, timeout_s: float = 10.0) -> None:
        """Leave the group and flush the producer; bounded, so a stop with the broker gone still ends."""
        try:
            await asyncio.wait_for(self.reader.stop(), timeout_s)
        except Exception:
            log.warning("closing the offset reader did not finish cleanly", exc_info=True)
        for client in (self.consumer, self.producer):
            if client is None:
                continue
            try:
                await asyncio.wait_for(client.stop(), timeout_s)
            except Exception:  # broker gone: nothing uncommitted is lost, the next owner re-reads it
                log.warning("closing %s did not finish cleanly", type(client).__name__, exc_info=True)

    # --- one step ---------------------------------------------------------------------------------

    async def process(self, batch: Mapping[TopicPartition, list[ConsumerRecord[Any, Any]]]) -> None:
        """Fold one fetch, produce its outputs and the state, then commit (a step with the state due, then
        settle): what a step did once the interval has passed."""
        await self.step(batch, state_due=True)
        await self.settle()

    async def step(
        self, batch: Mapping[TopicPartition, list[ConsumerRecord[Any, Any]]], *, state_due: bool = False
    ) -> None:
        """Fold one fetch, wait for the previous completion, then start this one's (in the background).
        ``state_due``: write the state and commit now, whatever the interval."""
        done = await self._fold_batch(batch, state_due)
        await self.settle()
        if done.owes():
            self._inflight = asyncio.ensure_future(self._complete(done))

    async def settle(self) -> None:
        """Wait for the completion in flight; its error (if any) is raised here."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def write_state(self) -> None:
        """Settle, then write the state of everything folded and commit its offsets now (a revocation, a
        stop). The caller holds the lock."""
        await self.settle()
        done = Completion()
        self._take_state(done, self._wall() * 1000.0)
        if done.owes():
            await self._complete(done)

    async def _fold_batch(
        self, batch: Mapping[TopicPartition, list[ConsumerRecord[Any, Any]]], state_due: bool = False
    ) -> Completion:
        """Decode and fold a fetch, run the idle tick, and collect what must be produced and committed."""
        m = self.metrics
        now = self._wall() * 1000.0
        done = Completion()
        outputs = done.outputs
        events = 0
        folded: set[int] = set()
        for tp, records in batch.items():
            if not records:
                continue
            if tp.partition not in self.owned:
                self._refetch_later(tp, records[0].offset)
                continue
            for start in range(0, len(records), FOLD_SLICE):
                if start:
                    await asyncio.sleep(0)  # lets the previous completion and the fetcher progress
                self._fold(records[start : start + FOLD_SLICE], now, outputs)
            self._deferred[tp] = self._next[tp.partition] = records[-1].offset + 1
            folded.add(tp.partition)
            events += len(records)
        self._deferred_events += events
        m.events_consumed.inc(events)
        if events:
            m.batches.inc()
        self._unacked += events
        m.unacked_events.set(self._unacked)
        for partition in sorted(self.owned):
            caught_up = self._idle(partition)
            if caught_up or partition in folded:
                for record in self.core.advance(partition, now, caught_up):
                    self._add_record(outputs, partition, record)
        join = self.settings.join
        # The interval, or a full fetch's worth folded (a backlog): a write never holds more than about
        # batch_max states, as when every fetch was written (the memory of a catch-up stays bounded).
        if state_due or self._deferred_events >= join.batch_max or now - self._last_state_ms >= join.state_every_ms:
            self._take_state(done, now)
        self._add_heartbeats(outputs, now)
        return done

    def _take_state(self, done: Completion, now_ms: float) -> None:
        """Move every state touched since the last write and every offset folded since the last commit
        into ``done`` (written after its records, committed after the state)."""
        self._last_state_ms = now_ms
        done.state = self._dirty_state()
        done.commits, self._deferred = self._deferred, {}
        done.events, self._deferred_events = self._deferred_events, 0

    async def _complete(self, done: Completion) -> None:
        """Records and dead letters, awaited; then state, awaited; then the offsets are committed."""
        m = self.metrics
        if done.outputs:
            await self._produce(done.outputs)
        if done.state:
            await self._produce(done.state)
        self._sync_metrics()
        if done.commits:
            assert self.consumer is not None
            await self.consumer.commit(done.commits)
            m.events_acked.inc(done.events)
        self._unacked -= done.events
        m.unacked_events.set(self._unacked)
        self._update_lag(done.commits)

    def _fold(self, records: list[ConsumerRecord[Any, Any]], now: float, outputs: Outputs) -> None:
        """Decode and fold one partition's records in order (the per-event loop: names bound once)."""
        caps = self.settings.caps
        guard, add, decode = self.guard, self.core.add, decode_stage_event
        for record in records:
            p = record.partition
            append_time = record.timestamp if record.timestamp_type == 1 else None  # LogAppendTime: the broker's
            decoded = decode(
                record.value,
                record.key,
                record.topic,
                p,
                record.offset,
                record.timestamp,
                caps,
                now,
                append_time_ms=append_time,
            )
            if guard.observe(isinstance(decoded, DeadLetter), decoded.tenant_id):
                self._halt(decoded, record)
            if guard.newly_quarantined:
                report_quarantines(self.settings, guard, self.metrics)
            if isinstance(decoded, DeadLetter):
                self._add_dead_letter(outputs, p, decoded)
                continue
            for out in add(decoded, p, now, offset=record.offset):
                if isinstance(out, dict):
                    self._add_record(outputs, p, out)
                else:
                    self._add_dead_letter(outputs, p, out.to_dead_letter(_Source(record), now, caps))

    def _refetch_later(self, tp: TopicPartition, offset: int) -> None:
        """Records of a partition whose state is not restored yet: never fold them, never skip them. The
        consumer's position already moved past them, so seek it back (the assignment pauses the partition
        until its state is restored; this covers records fetched before the pause took effect)."""
        assert self.consumer is not None
        if tp in self.consumer.assignment():
            self.consumer.seek(tp, offset)

    def _idle(self, partition: int) -> bool:
        """Nothing left to fetch on ``partition``: its watermark may move on the wall clock. A partition
        with a backlog is never idle, or requests would be emitted before their events are read. (Never
        ``await consumer.position()`` here: it waits for the fetcher while this step holds the lock.)"""
        assert self.consumer is not None
        highwater = self.consumer.highwater(TopicPartition(self.topic, partition))
        done = self._next.get(partition)
        return highwater is None or (done is not None and done >= highwater)

    def _unread_backlog(self, partition: int) -> bool:
        """Records are known to wait on ``partition`` and none was folded yet: its heartbeat (watermark 0)
        holds the writer's windows until they are, or a catch-up would close windows before this
        partition's share of them is read."""
        assert self.consumer is not None
        highwater = self.consumer.highwater(TopicPartition(self.topic, partition))
        done = self._next.get(partition)
        return highwater is not None and done is not None and done < highwater

    # --- outputs ----------------------------------------------------------------------------------

    def _add_record(self, outputs: Outputs, source: int, record: dict[str, Any]) -> None:
        status = record["status"]
        counter = self._emitted_by_status.get(status)
        if counter is None:  # labels() looks the child up under a lock: once per status, not per record
            counter = self._emitted_by_status[status] = self.metrics.records_emitted.labels(status)
        counter.inc()
        topic = self.requests_topic
        target = source % self._partitions[topic]
        outputs[(topic, target)].append((record["request_id"].encode(), orjson.dumps(record)))

    def _add_dead_letter(self, outputs: Outputs, source: int, dl: DeadLetter) -> None:
        self.metrics.dead_letters.labels(dl.reason_code).inc()
        key = f"{dl.source_topic}:{dl.source_partition}:{dl.source_offset}".encode()
        target = source % self._partitions[self.dead_letter_topic]
        outputs[(self.dead_letter_topic, target)].append((key, dl.model_dump_json().encode()))

    def _dirty_state(self) -> Outputs:
        """One changelog write per request touched since the last call (None: forgotten, a tombstone)."""
        state: Outputs = defaultdict(list)
        for key, (partition, packed) in self.core.dirty().items():
            state[(self.changelog, partition)].append((key.encode(), packed))
        return state

    def _sync_metrics(self) -> None:
        c, m = self.core.counters, self.metrics
        m.open_requests.set(self.core.open_requests)
        sync_counter(m.duplicates, c.duplicates)
        sync_counter(m.late_events, c.late_events)
        sync_counter(m.evictions, c.evictions)
        sync_counter(m.replayed_events, c.replayed)
        for cap, total in c.caps.items():
            sync_counter(m.caps_tripped.labels(cap), total)

    async def _produce(self, outputs: Outputs) -> None:
        """One producer batch per (topic, partition), all sent, then all acknowledgements awaited."""
        assert self.producer is not None
        if self._fault is not None:
            self._fault(outputs)
        await produce_batches(self.producer, outputs)

    def _heartbeat_due(self, now_ms: float) -> bool:
        return now_ms - self._last_heartbeat_ms >= HEARTBEAT_INTERVAL_MS

    def _add_heartbeats(self, outputs: Outputs, now_ms: float) -> None:
        """Each owned partition's watermark, on every requests partition, after the records it vouches for
        (the writer closes windows on the minimum; a partition without events sends nothing, one whose
        backlog is not read yet sends 0)."""
        if not self._heartbeat_due(now_ms):
            return
        self._last_heartbeat_ms = now_ms
        stats = {
            "worker_id": self.metrics.worker_id,
            "open_requests": self.core.open_requests,
            "evictions": self.core.counters.evictions,
        }
        for partition in sorted(self.owned):
            watermark = self.core.watermark(partition)
            if not watermark and not self._unread_backlog(partition):
                continue  # never carried an event: holds nobody back
            value = orjson.dumps(
                {"watermark_ms": watermark, "source_partition": partition, "lag": self._lag.get(partition), **stats}
            )
            for target in range(self._partitions[self.requests_topic]):
                outputs[(self.requests_topic, target)].append((WATERMARK_KEY, value))

    def _update_lag(self, commits: Mapping[TopicPartition, int]) -> None:
        assert self.consumer is not None
        for tp, offset in commits.items():
            highwater = self.consumer.highwater(tp)
            if highwater is not None:
                self._lag[tp.partition] = max(0, highwater - offset)
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(self._lag[tp.partition])

    def _halt(self, decoded: Any, record: ConsumerRecord[Any, Any]) -> None:
        """The dead-letter guard tripped: page (best effort), then exit with nothing of this batch committed."""
        where = (record.topic, record.partition, record.offset)
        key, value = halt_alert(self.settings, self.guard, decoded, where, self._wall() * 1000.0)
        raise _Halted(self.settings.topic("alerts"), key, value)

    async def _page_and_exit(self, halted: _Halted) -> None:
        """Produce TTFTIngestHalted (best effort, 10 s), then exit with nothing of the batch committed."""
        assert self.producer is not None
        try:
            fut = await self.producer.send(halted.topic, halted.value, key=halted.key)
            await asyncio.wait_for(fut, timeout=10)
        except Exception:  # the exit matters more than the page
            log.exception("could not produce TTFTIngestHalted")
        sys.stderr.flush()
        os._exit(EXIT_INGEST_HALTED)

    # --- ownership --------------------------------------------------------------------------------

    async def assigned(self, partitions: set[int]) -> None:
        """Restore the state of newly owned partitions from the changelog before their records are fetched."""
        new = sorted(partitions - self.owned)
        paused = [TopicPartition(self.topic, p) for p in new]
        assert self.consumer is not None
        self.consumer.pause(*paused)  # nothing of a partition is returned before its state is restored
        restored = await restore_partitions(self.settings, self.changelog, new, self.core)
        if new:
            self._next.update(await self.reader.committed(new))
        await self._rekey_legacy(set(new))
        self.owned |= set(new)
        self.metrics.open_requests.set(self.core.open_requests)
        self.metrics.health["status"] = "ok"
        self.metrics.health["partitions"] = sorted(self.owned)
        self.consumer.resume(*[tp for tp in paused if tp in self.consumer.assignment()])
        log.info("join state restored: %d requests on partitions %s", restored, new)

    async def _rekey_legacy(self, assigned: set[int]) -> None:
        """Move states restored under a bare request id (before issue 14) to their (tenant, id) key: the new
        entries are written and acknowledged first (the core marked them dirty), then the old keys deleted."""
        legacy = [(key, p) for key, p in self.core.legacy_keys if p in assigned]
        self.core.legacy_keys = []
        if not legacy:
            return
        await self._produce(self._dirty_state())
        tombstones: Outputs = defaultdict(list)
        for key, partition in legacy:
            tombstones[(self.changelog, partition)].append((key.encode(), None))
        await self._produce(tombstones)
        log.info("join state: %d requests re-keyed by (tenant, request id)", len(legacy))

    async def revoked(self, partitions: set[int]) -> None:
        """Wait for the batch in flight (committed when it ends), then drop the state of lost partitions."""
        async with self._lock:
            try:
                await self.write_state()  # the offsets folded are committed while the partitions are ours
            except Exception:
                _exit_uncommitted("join batch failed during a rebalance")
            gone = partitions & self.owned
            self.core.revoke(gone)
            self.owned -= gone
            for partition in gone:
                self._next.pop(partition, None)


def _exit_uncommitted(what: str) -> None:
    """End the process now, with nothing of the failed batch (or any later one) committed."""
    log.critical("%s; exiting so a restart replays it", what, exc_info=True)
    sys.stderr.flush()
    os._exit(EXIT_BATCH_FAILED)


class _Halted(Exception):
    """Raised out of a batch when the dead-letter guard trips; the runner pages and exits."""

    def __init__(self, topic: str, key: bytes, value: bytes) -> None:
        super().__init__("ingest halted")
        self.topic, self.key, self.value = topic, key, value


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, join: BatchJoin) -> None:
        self.join = join

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.join.revoked({tp.partition for tp in revoked if tp.topic == self.join.topic})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.join.assigned({tp.partition for tp in assigned if tp.topic == self.join.topic})


class _Source:
    """A consumer record seen as :class:`streams.core.join.SourceMessage` (timestamp in seconds)."""

    def __init__(self, record: ConsumerRecord[Any, Any]) -> None:
        self.value: bytes | None = record.value
        self.topic: str = record.topic
        self.partition: int = record.partition
        self.offset: int = record.offset
        self.timestamp: float | None = None if record.timestamp is None else record.timestamp / 1000.0
