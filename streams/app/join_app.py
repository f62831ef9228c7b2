"""The Faust side of the join: a thin adapter around :class:`streams.core.join.RequestJoin`.

What is durable when (the invariant the crash tests check):

1. A batch of stage events is taken with ``noack_take`` (nothing is acknowledged yet).
2. Each event is decoded; bad ones become dead letters. Good ones are folded by the pure core.
3. The records the core emitted, the dead letters, and one state write per touched request (to the
   compacted changelog of the ``join-state`` table, on the event's own partition) are produced and
   **awaited until the broker acknowledged them**.
4. Only then are the events acknowledged, so Faust may commit their offsets.

Faust's consumer can skip records around a rebalance and commit past them (``streams/core/cursors.py``).
The adapter keeps its own cursor per partition: a skipped range is read back directly from the partition
and folded before the event that revealed it; a re-delivered event is skipped; a partition stuck below
its log end is sought back to its cursor.

A crash anywhere before 4 replays the batch: the restored state recognises the replayed events as
duplicates, and a record emitted twice is absorbed by the store (``ReplacingMergeTree`` by request id).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import faust
import orjson
from faust.types import TP, EventT

from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from streams.app.join_guard import halt_alert, report_quarantines, sync_counter
from streams.app.metrics import WorkerMetrics
from streams.app.partition_reader import PartitionReader, RawRecord
from streams.core.cursors import OffsetCursors
from streams.core.guard import DeadLetterGuard
from streams.core.join import Refusal, RequestJoin, TenantMismatch
from streams.core.watermarks import WATERMARK_KEY
from streams.kafka.topics import faust_broker_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.join")

JOIN_STATE_TABLE = "join-state"
HEARTBEAT_INTERVAL_MS = 500.0
#: Exit status of a join worker halted by the dead-letter guard (distinct from crashes, which exit 1).
EXIT_INGEST_HALTED = 3
#: Exit status after an unexpected error in a batch: nothing of it was acked, a restart replays it.
EXIT_BATCH_FAILED = 1
#: A partition below its log end whose cursor has not moved for this long is sought back to the cursor.
STALL_REPAIR_S = 15.0


def create_join_app(settings: Settings, metrics: WorkerMetrics, worker_dir: str) -> faust.App:
    """Build the Faust app that joins stage events into request records."""
    app = faust.App(
        f"{settings.app_id}-join",
        **faust_broker_kwargs(settings),
        store="memory://",
        datadir=worker_dir,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=max(settings.session_timeout_s, 10.0),
        broker_commit_interval=0.5,
        broker_commit_every=10_000,
        broker_max_poll_records=5_000,
        stream_buffer_maxsize=20_000,
        producer_linger_ms=5,
        producer_max_batch_size=1_048_576,
        producer_max_request_size=4_194_304,
        producer_acks=-1,
        web_enabled=False,
        table_cleanup_interval=3600.0,
    )
    JoinAdapter(app, settings, metrics)
    return app


class JoinAdapter:
    """Wires the pure join into Faust: decode -> fold -> produce and await -> ack."""

    def __init__(self, app: faust.App, settings: Settings, metrics: WorkerMetrics) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.core = RequestJoin(settings.join, settings.windows.window_s * 1000)
        self.events_topic = app.topic(
            settings.topic("stage-events"),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=settings.partitions,
        )
        self.requests_topic = settings.topic("requests")
        self.dead_letter_topic = settings.topic("dead-letter")
        self.state = app.Table(
            JOIN_STATE_TABLE,
            key_type=bytes,  # bytes keys and values: the "raw" codec, our own packed state
            value_type=bytes,
            partitions=settings.partitions,
            on_recover=self._on_recover,
        )
        self.changelog_topic = self.state.changelog_topic.get_topic_name()
        self._lock = asyncio.Lock()
        self._last_heartbeat_ms = 0.0
        self.cursors = OffsetCursors()
        self._lag: dict[int, int] = {}  # per owned partition: log end minus committed offset
        self.reader = PartitionReader(settings, self.events_topic.get_topic_name(), app.conf.id)
        self.guard = DeadLetterGuard(
            settings.caps.halt_window_messages,
            settings.caps.halt_dead_letter_share,
            settings.caps.max_quarantined_tenants,
        )
        self._recovered = False
        app.agent(self.events_topic, name="join", concurrency=1)(self._agent)
        app.timer(settings.join.idle_tick_ms / 1000.0)(self._tick)
        app.on_before_shutdown.connect(self._on_shutdown)
        metrics.health["status"] = "starting"

    # --- recovery ---------------------------------------------------------------------------

    async def _on_recover(self) -> None:
        """Rebuild the in-memory join from the recovered table (after start and every rebalance)."""
        async with self._lock:
            assigned = {
                tp.partition
                for tp in self.app.assignor.assigned_actives()
                if tp.topic == self.events_topic.get_topic_name()
            }
            self.core.reset()
            restored = 0
            stale: list[bytes] = []
            stale_partitions: set[int] = set()
            for key, packed in list(self.state.data.items()):
                partition = self.core.restore(key.decode(), packed)
                if partition not in assigned:
                    stale_partitions.add(partition)
                    stale.append(key)
                else:
                    restored += 1
            if stale_partitions:
                self.core.revoke(stale_partitions)
            for key in stale:
                self.state.data.pop(key, None)
            await self._rekey_legacy(assigned)
            self.cursors.forget(set(self.cursors.partitions()) - assigned)
            await self._start_cursors(sorted(assigned))
            self._recovered = True
            self.metrics.open_requests.set(self.core.open_requests)
            self.metrics.health["status"] = "ok"
            self.metrics.health["partitions"] = sorted(assigned)
            log.info("join state recovered: %d requests on partitions %s", restored, sorted(assigned))

    async def _rekey_legacy(self, assigned: set[int]) -> None:
        """Move states restored under a bare request id (before issue 14) to their (tenant, id) key:
        the new entries are written and acknowledged first, then the old keys are deleted."""
        legacy = [(key, p) for key, p in self.core.legacy_keys if p in assigned]
        self.core.legacy_keys = []
        if not legacy:
            return
        await self._flush([])
        producer = self.app.producer
        futures = []
        for key, partition in legacy:
            self.state.data.pop(key.encode(), None)
            futures.append(
                await producer.send(
                    self.changelog_topic, key.encode(), None, partition=partition, timestamp=None, headers=None
                )
            )
        await asyncio.gather(*futures)
        log.info("join state: %d requests re-keyed by (tenant, request id)", len(legacy))

    async def _on_shutdown(self, sender: Any, /, *_: Any, signal: Any, **__: Any) -> None:
        await self.reader.stop()

    # --- the agent ----------------------------------------------------------------------------

    async def _agent(self, stream: Any) -> None:
        batch_max = self.settings.join.batch_max
        within = self.settings.join.batch_within_s
        # noack_take yields events and never acks them: we ack once outputs are durable (faust.md §0.1).
        async for events in stream.noack_take(batch_max, within):
            await self._process_batch(stream, events)

    async def _process_batch(self, stream: Any, events: Sequence[EventT[Any]]) -> None:
        m = self.metrics
        m.unacked_events.set(len(events))
        m.events_consumed.inc(len(events))
        try:
            async with self._lock:
                outputs: list[tuple[str, bytes | None, bytes]] = []  # (topic, key, value)
                now = time.time() * 1000.0
                touched: set[int] = set()
                for event in events:
                    msg = event.message
                    if not self.cursors.known(msg.partition):
                        await self._start_cursors([msg.partition])
                    position = self.cursors.classify(msg.partition, msg.offset)
                    if position == "replay":
                        m.replayed_events.inc()
                        continue
                    if position == "gap":
                        await self._repair_gap(msg.partition, msg.offset, now, outputs, touched)
                    await self._fold(msg, now, outputs, touched)
                for partition in touched:
                    for record in self.core.advance(partition, now, caught_up=False):
                        outputs.append(self._record_output(record))
                await self._flush(outputs)
        except Exception:
            # Faust would ack and commit past a failing batch (faust.md 0.1); exit instead, nothing acked.
            log.critical("join batch failed; exiting so a restart replays it", exc_info=True)
            sys.stderr.flush()
            os._exit(EXIT_BATCH_FAILED)
        for event in events:
            await stream.ack(event)
        m.events_acked.inc(len(events))
        m.unacked_events.set(0)
        m.batches.inc()

    async def _fold(
        self,
        msg: Any,
        now: float,
        outputs: list[tuple[str, bytes | None, bytes]],
        touched: set[int],
    ) -> None:
        """Decode one message and fold it into the join (or dead-letter it); move its partition's cursor."""
        caps = self.settings.caps
        decoded = decode_stage_event(
            msg.value,
            msg.key,
            msg.topic,
            msg.partition,
            msg.offset,
            _ts_ms(msg),
            caps,
            now,
            append_time_ms=_append_time_ms(msg),
        )
        if self.guard.observe(isinstance(decoded, DeadLetter), decoded.tenant_id):
            await self._halt(decoded, msg)  # never returns: nothing of this batch is acked
        if self.guard.newly_quarantined:
            report_quarantines(self.settings, self.guard, self.metrics)
        self.cursors.advance(msg.partition, msg.offset)
        if isinstance(decoded, DeadLetter):
            outputs.append(self._dead_letter_output(decoded))
            return
        touched.add(msg.partition)
        for out in self.core.add(decoded, msg.partition, now, offset=msg.offset):
            if isinstance(out, TenantMismatch | Refusal):
                outputs.append(self._dead_letter_output(out.to_dead_letter(msg, now, caps)))
            else:
                outputs.append(self._record_output(out))

    async def _repair_gap(
        self,
        partition: int,
        offset: int,
        now: float,
        outputs: list[tuple[str, bytes | None, bytes]],
        touched: set[int],
    ) -> None:
        """Fold the records Faust skipped below ``offset`` (none if the hole is compaction or markers)."""
        start = self.cursors.next_offset(partition)
        assert start is not None
        missing: list[RawRecord] = await self.reader.read(partition, start, offset)
        log.warning(
            "partition %d: the consumer skipped offsets %d..%d; read back %d records",
            partition,
            start,
            offset - 1,
            len(missing),
        )
        for record in missing:
            if self.cursors.classify(partition, record.offset) == "replay":
                continue
            await self._fold(record, now, outputs, touched)
        self.metrics.repaired_events.inc(len(missing))
        await self._mark_committable(partition, start, offset - 1)

    async def _mark_committable(self, partition: int, first: int, last: int) -> None:
        """Let Faust commit over ``[first, last]`` once the event after it is acked.

        Faust commits only contiguous acked offsets; it never saw the records of a hole, so without this its
        committed offset would stay below the hole for good. ``_add_gap`` is how Faust itself files offsets
        that hold no records (faust/transport/consumer.py); there is no public way.
        """
        add_gap = getattr(self.app.consumer, "_add_gap", None)
        if add_gap is None:
            log.warning("faust has no Consumer._add_gap: partition %d may not commit past the hole", partition)
            return
        await add_gap(TP(self.events_topic.get_topic_name(), partition), first, last)

    async def _start_cursors(self, partitions: list[int]) -> None:
        """Start the cursors of newly owned partitions at the group's committed offsets."""
        if not partitions:
            return
        committed = await self.reader.committed(partitions)
        for partition in partitions:
            self.cursors.start(partition, committed[partition])

    async def _tick(self) -> None:
        """Idle tick: advance every owned partition's watermark on the wall clock and emit what is due."""
        if not self._recovered:
            return
        self._update_lag()
        async with self._lock:
            now = time.time() * 1000.0
            outputs = []
            for partition in self._idle_partitions():
                outputs += [self._record_output(r) for r in self.core.advance(partition, now)]
            if outputs or self.core.has_dirty() or self._heartbeat_due(now):
                await self._flush(outputs)
            await self._seek_stalled()

    async def _seek_stalled(self) -> None:
        """Seek a partition stuck below its log end back to its cursor, so its records come through again."""
        topic = self.events_topic.get_topic_name()
        consumer = self.app.consumer
        for tp in self.app.assignor.assigned_actives():
            if tp.topic != topic:
                continue
            try:
                highwater = consumer.highwater(tp)
            except Exception:  # not fetched yet
                continue
            if not self.cursors.stalled(tp.partition, highwater, STALL_REPAIR_S):
                continue
            cursor = self.cursors.next_offset(tp.partition)
            assert cursor is not None
            log.warning(
                "partition %d: no progress for %.0f s with records up to offset %d waiting; seeking back to %d",
                tp.partition,
                STALL_REPAIR_S,
                highwater,
                cursor,
            )
            self.cursors.touch(tp.partition)
            try:
                await consumer.seek(tp, cursor)
            except Exception:  # a rebalance took the partition meanwhile: the next recovery restarts it
                log.warning("could not seek partition %d", tp.partition, exc_info=True)

    async def _halt(self, decoded: Any, msg: Any) -> None:
        """The dead-letter guard tripped: page, then exit before anything of this batch is acknowledged."""
        where = (msg.topic, msg.partition, msg.offset)
        key, value = halt_alert(self.settings, self.guard, decoded, where, time.time() * 1000.0)
        try:
            fut = await self.app.producer.send(
                self.settings.topic("alerts"), key, value, partition=None, timestamp=None, headers=None
            )
            await asyncio.wait_for(fut, timeout=10)
        except Exception:  # the exit below matters more than the page
            log.exception("could not produce TTFTIngestHalted")
        sys.stderr.flush()
        os._exit(EXIT_INGEST_HALTED)

    def _idle_partitions(self) -> list[int]:
        """Owned partitions with nothing left to fetch. A partition with a backlog is not idle, however long
        its fetch stalls: moving its watermark on the wall clock would emit requests before their events."""
        topic = self.events_topic.get_topic_name()
        consumer = self.app.consumer
        committed: dict[Any, int] = getattr(consumer, "_committed_offset", {})  # faust keeps no public view
        idle: list[int] = []
        for tp in self.app.assignor.assigned_actives():
            if tp.topic != topic:
                continue
            try:
                highwater = consumer.highwater(tp)
            except Exception:  # not fetched yet: nothing known to be pending
                highwater = None
            done = self.cursors.next_offset(tp.partition) or committed.get(tp) or 0
            if highwater is not None and highwater > done:
                continue
            idle.append(tp.partition)
        return idle

    def _update_lag(self) -> None:
        """Consumer lag per owned partition: log end offset minus the committed offset."""
        consumer = self.app.consumer
        committed: dict[Any, int] = getattr(consumer, "_committed_offset", {})  # faust keeps no public view
        for tp in consumer.assignment():
            if tp.topic != self.events_topic.get_topic_name():
                continue
            try:
                highwater = consumer.highwater(tp)
            except Exception:  # not fetched yet
                continue
            if highwater is not None:
                done = committed.get(tp) or 0
                self._lag[tp.partition] = max(0, highwater - done)
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(self._lag[tp.partition])

    # --- watermark heartbeats ---------------------------------------------------------------------

    def _heartbeat_due(self, now_ms: float) -> bool:
        return now_ms - self._last_heartbeat_ms >= HEARTBEAT_INTERVAL_MS

    async def _send_heartbeats(self, now_ms: float) -> None:
        """Tell the writer how far each owned partition's event time has progressed.

        One message per (owned stage-events partition, requests partition), produced after the records
        of the batch: on each requests partition the heartbeat follows every record it vouches for, so the
        writer may close windows on the minimum it has seen, whatever order it reads partitions in. A
        partition without events sends nothing (reporting the wall clock would close historical windows
        before their records arrive).
        """
        if not self._heartbeat_due(now_ms):
            return
        self._last_heartbeat_ms = now_ms
        topic = self.events_topic.get_topic_name()
        owned = sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic)
        producer = self.app.producer
        # The join's own gauges ride along, so the writer can put them into pipeline_stats (the join has no
        # store of its own: chDB allows one writer).
        stats = {
            "worker_id": self.metrics.worker_id,
            "open_requests": self.core.open_requests,
            "evictions": self.core.counters.evictions,
        }
        for partition in owned:
            watermark = self.core.watermark(partition)
            if not watermark:
                continue
            value = orjson.dumps(
                {"watermark_ms": watermark, "source_partition": partition, "lag": self._lag.get(partition), **stats}
            )
            for target in range(self.settings.partitions):
                # Not awaited: the producer keeps per-partition order, so each heartbeat still follows the
                # records it vouches for; a lost heartbeat only delays a window (the next one supersedes it).
                fut = await producer.send(
                    self.requests_topic, WATERMARK_KEY, value, partition=target, timestamp=None, headers=None
                )
                asyncio.ensure_future(fut).add_done_callback(_log_failure)

    # --- producing ----------------------------------------------------------------------------

    def _record_output(self, record: dict[str, Any]) -> tuple[str, bytes | None, bytes]:
        self.metrics.records_emitted.labels(record["status"]).inc()
        return (self.requests_topic, record["request_id"].encode(), orjson.dumps(record))

    def _dead_letter_output(self, dl: DeadLetter) -> tuple[str, bytes | None, bytes]:
        self.metrics.dead_letters.labels(dl.reason_code).inc()
        key = f"{dl.source_topic}:{dl.source_partition}:{dl.source_offset}".encode()
        return (self.dead_letter_topic, key, dl.model_dump_json().encode())

    async def _flush(self, outputs: list[tuple[str, bytes | None, bytes]]) -> None:
        """Produce records, dead letters and state writes; return once the broker acknowledged all."""
        producer = self.app.producer
        futures: list[Awaitable[Any]] = []
        for topic, key, value in outputs:
            futures.append(await producer.send(topic, key, value, partition=None, timestamp=None, headers=None))
        # Records first, state second: a crash in between re-emits (absorbed), never loses a record.
        if futures:
            await asyncio.gather(*futures)
        futures = []
        for request_id, (partition, packed) in self.core.dirty().items():
            key = request_id.encode()
            if packed is None:
                self.state.data.pop(key, None)
            else:
                self.state.data[key] = packed
            futures.append(
                await producer.send(
                    self.changelog_topic, key, packed, partition=partition, timestamp=None, headers=None
                )
            )
        if futures:
            await asyncio.gather(*futures)
        await self._send_heartbeats(time.time() * 1000.0)
        c = self.core.counters
        m = self.metrics
        m.open_requests.set(self.core.open_requests)
        sync_counter(m.duplicates, c.duplicates)
        sync_counter(m.late_events, c.late_events)
        sync_counter(m.evictions, c.evictions)
        for cap, total in c.caps.items():
            sync_counter(m.caps_tripped.labels(cap), total)


def _log_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("watermark heartbeat not delivered: %s", fut.exception())


def _ts_ms(message: Any) -> int | None:
    ts = getattr(message, "timestamp", None)
    if ts is None:
        return None
    return int(ts * 1000)


def _append_time_ms(message: Any) -> int | None:
    """The broker's append time of a ``LogAppendTime`` message (timestamp type 1), else None."""
    if getattr(message, "timestamp_type", None) != 1:
        return None
    return _ts_ms(message)
