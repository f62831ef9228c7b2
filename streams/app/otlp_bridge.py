"""OTLP spans in, stage events out: the Collector's kafkaexporter topic feeding the join (``otlp.enabled``).

It runs in the join process beside :class:`streams.app.batch_join.BatchJoin`, on its own aiokafka group
consumer (``{app_id}-otlp``) of ``otlp.topic``. What is durable when, per fetched batch:

1. ``getmany`` returns whole messages (each an ``ExportTraceServiceRequest``); nothing is committed yet.
2. Each is decoded (:func:`schemas.otlp.decode_otlp_message`; a bad one is a dead letter) and folded by
   :class:`streams.core.otlp_traces.TraceAssembler`; partitions without a backlog get the idle tick.
3. The resolved stage events go to ``ttft.stage-events`` keyed by request id, on the partition the
   emitter's producer would pick for that key (so an emitted and an OTLP request meet the join alike),
   and the dead letters to ``ttft.dead-letter``; all acknowledgements are **awaited**.
4. The state of every trace the batch touched goes to the compacted ``{app_id}-otlp-traces-changelog``
   (a tombstone once forgotten) and is **awaited**.
5. Only then are the batch's offsets committed.

A crash before 5 replays the batch: the restored traces recognise spans already forwarded, and an event
produced twice carries the same ``event_id`` (the span id), which the join counts once. A batch that
raises ends the process with nothing committed. On assignment the partitions are paused until their
traces are restored from the changelog; on revocation the batch in flight finishes first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from schemas.dead_letter import DeadLetter
from schemas.otlp import decode_otlp_message
from streams.app.batch_join import CHANGELOG_CONFIGS, EXIT_BATCH_FAILED, Outputs, produce_batches
from streams.app.join_changelog import restore_partitions
from streams.app.join_guard import sync_counter
from streams.app.metrics import WorkerMetrics
from streams.app.partition_reader import PartitionReader
from streams.core.otlp_traces import SPAN_OUTCOMES, ForwardedEvent, Output, TraceAssembler
from streams.kafka.topics import ensure_named_topics, kafka_client_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.otlp")

_POLL_MS = 200
#: Messages per fetch: an OTLP message holds many spans, so fewer than the join's events per batch.
_BATCH_MESSAGES = 500


def otlp_group_id(settings: Settings) -> str:
    """The bridge's consumer group."""
    return f"{settings.app_id}-otlp"


def otlp_changelog_topic(settings: Settings) -> str:
    """The compacted topic of the held and remembered traces (key: trace id)."""
    return f"{settings.app_id}-otlp-traces-changelog"


class OtlpBridge:
    """Consume OTLP span messages, assemble traces, produce stage events, commit (module docstring)."""

    def __init__(
        self, settings: Settings, metrics: WorkerMetrics, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._wall = wall_clock
        self.topic = settings.otlp.topic
        self.stage_topic = settings.topic("stage-events")
        self.dead_letter_topic = settings.topic("dead-letter")
        self.changelog = otlp_changelog_topic(settings)
        self.core = TraceAssembler(settings.otlp, settings.join, settings.caps, self.topic)
        self.owned: set[int] = set()
        self._partitioner = DefaultPartitioner()
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._partitions: dict[str, list[int]] = {}
        #: Per owned partition, the next offset to fold (see BatchJoin._next): tells an idle partition.
        self._next: dict[int, int] = {}
        self.reader = PartitionReader(settings, self.topic, otlp_group_id(settings))
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None

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
        for topic in (self.stage_topic, self.dead_letter_topic):
            self._partitions[topic] = sorted(await self.producer.partitions_for(topic))
        session_ms = int(s.session_timeout_s * 1000)
        self.consumer = AIOKafkaConsumer(
            group_id=otlp_group_id(s),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=_BATCH_MESSAGES,
            fetch_max_bytes=64 * 1_048_576,
            max_partition_fetch_bytes=8 * 1_048_576,
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
                batch = await self.consumer.getmany(timeout_ms=_POLL_MS, max_records=_BATCH_MESSAGES)
                if self._stopping.is_set():
                    break  # fetched, not folded, not committed: the next owner reads it again
                async with self._lock:
                    try:
                        await self.process(batch)
                    except Exception:
                        log.critical("otlp batch failed; exiting so a restart replays it", exc_info=True)
                        sys.stderr.flush()
                        os._exit(EXIT_BATCH_FAILED)
        finally:
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
        """Fold one fetch, produce its events and dead letters, write the traces' state, then commit."""
        now = self._wall() * 1000.0
        outputs: Outputs = defaultdict(list)
        commits: dict[TopicPartition, int] = {}
        count = 0
        for tp, records in batch.items():
            if not records:
                continue
            if tp.partition not in self.owned:
                self._refetch_later(tp, records[0].offset)
                continue
            for record in records:
                self._fold(record, now, outputs)
            commits[tp] = self._next[tp.partition] = records[-1].offset + 1
            count += len(records)
        for partition in sorted(self.owned):
            if TopicPartition(self.topic, partition) in commits or self._idle(partition):
                self._add(outputs, partition, self.core.advance(partition, now))
        if outputs or self.core.has_dirty():
            await self._produce(outputs)
            state: Outputs = defaultdict(list)
            for trace_id, (partition, packed) in self.core.dirty().items():
                state[(self.changelog, partition)].append((trace_id.encode(), packed))
            await self._produce(state)
        self._sync_metrics()
        if commits:
            assert self.consumer is not None
            await self.consumer.commit(commits)
            self.metrics.otlp_messages.inc(count)

    def _fold(self, record: ConsumerRecord[Any, Any], now: float, outputs: Outputs) -> None:
        decoded = decode_otlp_message(
            record.value,
            self.settings.otlp.encoding,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            kafka_timestamp_ms=record.timestamp,
            caps=self.settings.caps,
            received_at_ms=now,
        )
        if isinstance(decoded, DeadLetter):
            self._add(outputs, record.partition, [decoded])
            return
        self._add(outputs, record.partition, self.core.add_message(decoded, record.partition, record.offset, now))

    def _add(self, outputs: Outputs, source: int, items: list[Output]) -> None:
        for item in items:
            if isinstance(item, ForwardedEvent):
                key = item.request_id.encode()
                partitions = self._partitions[self.stage_topic]
                target = self._partitioner(key, partitions, partitions)  # what the emitter's producer picks
                outputs[(self.stage_topic, target)].append((key, item.value))
            else:
                self.metrics.dead_letters.labels(item.reason_code).inc()
                where = f"{item.source_topic}:{item.source_partition}:{item.source_offset}:{item.span_id or ''}"
                targets = self._partitions[self.dead_letter_topic]
                outputs[(self.dead_letter_topic, targets[source % len(targets)])].append(
                    (where.encode(), item.model_dump_json().encode())
                )

    def _refetch_later(self, tp: TopicPartition, offset: int) -> None:
        """Records of a partition not restored yet: seek back, never fold or skip them (as BatchJoin)."""
        assert self.consumer is not None
        if tp in self.consumer.assignment():
            self.consumer.seek(tp, offset)

    def _idle(self, partition: int) -> bool:
        """Nothing left to fetch on ``partition``: its watermark may move on the wall clock."""
        assert self.consumer is not None
        highwater = self.consumer.highwater(TopicPartition(self.topic, partition))
        done = self._next.get(partition)
        return highwater is None or (done is not None and done >= highwater)

    async def _produce(self, outputs: Outputs) -> None:
        """One producer batch per (topic, partition), all sent, then all acknowledgements awaited."""
        assert self.producer is not None
        await produce_batches(self.producer, outputs)

    def _sync_metrics(self) -> None:
        c, m = self.core.counters, self.metrics
        for outcome in SPAN_OUTCOMES:
            sync_counter(m.otlp_spans.labels(outcome), c.spans[outcome])
        for cap, total in c.caps.items():
            sync_counter(m.caps_tripped.labels(cap), total)
        m.otlp_traces_held.set(self.core.held_traces)
        m.otlp_spans_held.set(self.core.held_spans)

    # --- ownership --------------------------------------------------------------------------------

    async def assigned(self, partitions: set[int]) -> None:
        """Restore the traces of newly owned partitions before any of their messages is fetched."""
        new = sorted(partitions - self.owned)
        paused = [TopicPartition(self.topic, p) for p in new]
        assert self.consumer is not None
        self.consumer.pause(*paused)
        restored = await restore_partitions(self.settings, self.changelog, new, self.core)
        if new:
            self._next.update(await self.reader.committed(new))
        self.owned |= set(new)
        self.consumer.resume(*[tp for tp in paused if tp in self.consumer.assignment()])
        log.info("otlp traces restored: %d on partitions %s", restored, new)

    async def revoked(self, partitions: set[int]) -> None:
        """Wait for the batch in flight (committed when it ends), then drop the traces of lost partitions."""
        async with self._lock:
            gone = partitions & self.owned
            self.core.revoke(gone)
            self.owned -= gone
            for partition in gone:
                self._next.pop(partition, None)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, bridge: OtlpBridge) -> None:
        self.bridge = bridge

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.bridge.revoked({tp.partition for tp in revoked if tp.topic == self.bridge.topic})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.bridge.assigned({tp.partition for tp in assigned if tp.topic == self.bridge.topic})
