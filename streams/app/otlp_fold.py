"""OTLP spans in, stage events out: the Collector's kafkaexporter topic as a fold of the partition-batch runner.

It runs in the join's ``ttft worker`` beside the join (``otlp.enabled``), on its own consumer group
(``{app_id}-otlp``) of ``otlp.topic``. :class:`OtlpFold` decodes each message (an
``ExportTraceServiceRequest``; a bad one is a dead letter) and folds its spans through
:class:`streams.core.otlp_traces.TraceAssembler`; the resolved stage events go to ``ttft.stage-events``
keyed by request id, on the partition the emitter's producer would pick for that key (so an emitted and an
OTLP request meet the join alike). The runner (:mod:`streams.kafka.batches`) makes them durable in order:
events and dead letters, then the state of every trace touched (compacted
``{app_id}-otlp-traces-changelog``, a tombstone once forgotten), then the offsets, with every fetch.

A span or message that the assembler cannot fold is dead-lettered (with its trace and span ids), never a
failed batch: the process goes on with the batch's other spans (:mod:`streams.core.otlp_traces`).

A crash before the commit replays the fetch: the restored traces recognise spans already forwarded, and an
event produced twice carries the same ``event_id`` (the span id), which the join counts once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import ConsumerRecord

from schemas.dead_letter import DeadLetter, make_dead_letter
from schemas.otlp import OtlpSpan, decode_otlp_message
from streams.app.keyed_state import KeyedStateFold
from streams.app.metrics import WorkerMetrics, sync_counter
from streams.core.otlp_outputs import SPAN_OUTCOMES, ForwardedEvent, Output
from streams.core.otlp_traces import TraceAssembler
from streams.kafka.batches import Emit, PartitionView, Records, Report, RunnerConfig, RunnerMetrics, by_key
from streams.kafka.unreadable import unreadable_letter
from streams.settings import Settings

log = logging.getLogger("ttft.otlp")

#: Messages per fetch: an OTLP message holds many spans, so fewer than the join's events per fetch.
BATCH_MESSAGES = 500


def otlp_runner_config(settings: Settings) -> RunnerConfig:
    """The bridge's consumer group ``{app_id}-otlp``: state and commit with every fetch; events routed as
    the emitter's producer routes them; the held and remembered traces in ``{app_id}-otlp-traces-changelog``
    (key: trace id)."""
    return RunnerConfig(
        name="otlp",
        group_id=f"{settings.app_id}-otlp",
        topics=(settings.otlp.topic,),
        output_topics=(settings.topic("stage-events"), settings.topic("dead-letter")),
        routes={settings.topic("stage-events"): by_key},
        changelog=f"{settings.app_id}-otlp-traces-changelog",
        # A trace's state goes to its span partition's number: grown with the span topic (partition_fit).
        changelog_partitions=settings.partitions,
        batch_max=BATCH_MESSAGES,
        # The join's prefetch in the same process (an OTLP message is larger, but 500 of them fit).
        fetch_max_bytes=16 * 1_048_576,
        max_partition_fetch_bytes=8 * 1_048_576,
    )


def keyed_by_trace(key: bytes | None, spans: Sequence[OtlpSpan]) -> bool:
    """Whether a message is what the exporter's ``partition_traces_by_id`` makes: keyed by the trace id (32
    lowercase hex) of every span it holds, so a trace's messages share a partition and a worker."""
    if not spans:
        return True
    if key is None:
        return False
    trace_id = key.decode("ascii", "replace")
    return all(span.trace_id == trace_id for span in spans)


def otlp_runner_metrics(metrics: WorkerMetrics) -> RunnerMetrics:
    return RunnerMetrics(
        acked=metrics.otlp_messages, lag=metrics.consumer_lag, refused=metrics.produce_refused.labels("batch")
    )


class OtlpFold(KeyedStateFold):
    """OTLP messages → stage events and dead letters (module docstring)."""

    core: TraceAssembler

    def __init__(
        self, settings: Settings, metrics: WorkerMetrics, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(settings, metrics, str(otlp_runner_config(settings).changelog), wall_clock)
        self.stage_topic = settings.topic("stage-events")
        self.core = TraceAssembler(settings.otlp, settings.join, settings.caps, settings.otlp.topic)
        self._warned_unkeyed = False

    async def fold(self, records: Records, now_ms: float, view: PartitionView, emit: Emit) -> None:
        s = self.settings
        for tp, items in records.items():
            for record in items:
                if record.value is None:  # the runner's stand-in for a record it cannot read (else a tombstone)
                    letter = unreadable_letter(record, now_ms, s.caps.dead_letter_bytes)
                    if letter is not None:
                        self._emit(emit, tp.partition, [letter])
                        continue
                try:
                    decoded = decode_otlp_message(
                        record.value,
                        s.otlp.encoding,
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        kafka_timestamp_ms=record.timestamp,
                        caps=s.caps,
                        received_at_ms=now_ms,
                        tenant_source=s.otlp.tenant_source,
                    )
                    if isinstance(decoded, DeadLetter):
                        outputs: list[Output] = [decoded]
                    else:
                        ignored = sum(span.ignored_tenant_claim for span in decoded)
                        if ignored:
                            self.metrics.otlp_tenant_claims_ignored.inc(ignored)
                        if not keyed_by_trace(record.key, decoded):
                            self._not_one_trace(record)
                        outputs = self.core.add_message(decoded, tp.partition, record.offset, now_ms)
                except Exception as exc:  # neither raises; should one, this message alone is lost
                    log.exception(
                        "OTLP message %s:%d:%d failed; dead-lettered", record.topic, tp.partition, record.offset
                    )
                    outputs = [self._failed(record, now_ms, exc)]
                self._emit(emit, tp.partition, outputs)
        for tp in sorted(view.owned):
            caught_up = view.idle(tp)
            if not (tp in records or caught_up):
                self.core.hold_idle(tp.partition)  # (advance holds them too when it is called not caught up)
                continue
            try:
                outputs = self.core.advance(tp.partition, now_ms, caught_up)
            except Exception:  # the assembler never raises; should it, the partition's traces wait
                log.exception("OTLP partition %d: advancing failed", tp.partition)
                continue
            self._emit(emit, tp.partition, outputs)

    def _not_one_trace(self, record: ConsumerRecord[Any, Any]) -> None:
        """A message that is not one trace keyed by its id: counted, and said once per worker."""
        self.metrics.otlp_unkeyed_messages.inc()
        if not self._warned_unkeyed:
            self._warned_unkeyed = True
            log.warning(
                "OTLP message %s:%d:%d is not one trace keyed by its id: the Collector's kafka exporter needs "
                "partition_traces_by_id: true (deploy/otel/collector.yaml). With several join workers a trace's "
                "spans can reach different workers; counted in ttft_otlp_unkeyed_messages",
                record.topic,
                record.partition,
                record.offset,
            )

    def _failed(self, record: ConsumerRecord[Any, Any], now_ms: float, exc: Exception) -> DeadLetter:
        """A dead letter for a whole message the assembler failed on (``schema``, with the error)."""
        return make_dead_letter(
            "schema",
            f"the OTLP mapping failed on this message: {type(exc).__name__}: {str(exc)[:200]}",
            b"" if record.value is None else bytes(record.value),
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            kafka_timestamp_ms=record.timestamp,
            max_original_bytes=self.settings.caps.dead_letter_bytes,
            received_at_ms=now_ms,
        )

    def report(self) -> Report:
        """The gauges as of this fold (the runner publishes them once its outputs are acknowledged)."""
        traces, spans = self.core.held_traces, self.core.held_spans
        return lambda: self._publish(traces, spans)

    def _publish(self, held_traces: int, held_spans: int) -> None:
        c, m = self.core.counters, self.metrics
        for outcome in SPAN_OUTCOMES:
            sync_counter(m.otlp_spans.labels(outcome), c.spans[outcome])
        for cap, total in c.caps.items():
            sync_counter(m.caps_tripped.labels(cap), total)
        for (scope, version), total in c.no_first_chunk.items():
            sync_counter(m.otlp_no_first_chunk.labels(scope, version), total)
        sync_counter(m.otlp_cut_off_traces, c.cut_off)
        m.otlp_traces_held.set(held_traces)
        m.otlp_spans_held.set(held_spans)

    def _emit(self, emit: Emit, source: int, items: list[Output]) -> None:
        for item in items:
            if isinstance(item, ForwardedEvent):
                emit(self.stage_topic, item.request_id.encode(), item.value, source)
            else:
                self.metrics.dead_letters.labels(item.reason_code).inc()
                where = f"{item.source_topic}:{item.source_partition}:{item.source_offset}:{item.span_id or ''}"
                emit(self.dead_letter_topic, where.encode(), item.model_dump_json().encode(), source)
