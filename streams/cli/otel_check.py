"""``ttft otel check``: read recent traces (the span topic, or a file) and print what they become.

The analysis is :mod:`streams.core.otlp_check`; this module reads the spans and prints. Two sources:

- the span topic (``otlp.topic``, the Collector's ``kafkaexporter``, encoding ``otlp.encoding``): the tail
  of every partition, widened until it holds ``--traces`` whole traces or the whole topic was read. No
  consumer group, nothing committed. A trace seen in the first messages of a partition's tail may have
  spans before it, so those traces are left out while the tail does not start at the partition's start;
- a file: OTLP/JSON, one ``ExportTraceServiceRequest`` per line (the Collector's ``file`` exporter), or
  protobuf messages each after a 4-byte big-endian length (the ``file`` exporter's ``format: proto``, and
  ``tests/data/otel_instrumentations/*.otlp``), or one protobuf message.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiokafka import AIOKafkaConsumer, TopicPartition

from schemas.otlp import OtlpDecodeError, OtlpEncoding, OtlpSpan, TenantSource, parse_spans
from streams.alerting.outbox import topic_partitions
from streams.app.otlp_fold import keyed_by_trace
from streams.core.otlp_check import ScopeReport, TraceFinding, fix_for
from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings

#: Messages at the head of a partition's tail whose traces may have begun before it.
_EDGE_MESSAGES: Final = 16
_LENGTH: Final = struct.Struct(">I")


class SpanSourceError(ValueError):
    """The file or topic holds no readable OTLP traces."""


@dataclass(slots=True)
class TailStats:
    """What reading the span topic saw besides spans: the messages decoded, and those not keyed by the trace id
    of every span they hold (the Collector's kafka exporter without ``partition_traces_by_id: true``)."""

    messages: int = 0
    unkeyed: int = 0
    #: The first unkeyed message (topic:partition:offset), for ``kcat -C``.
    example: str = ""

    def note(self) -> str:
        """The report's line on unkeyed messages (empty when there were none)."""
        if not self.unkeyed:
            return ""
        return (
            f"{self.unkeyed} of {self.messages} messages are not keyed by their trace id (e.g. {self.example}): "
            "set partition_traces_by_id: true in the Collector's kafka exporter (deploy/otel/collector.yaml), "
            "or a trace's spans can reach different join workers"
        )


def read_span_file(path: Path) -> list[OtlpSpan]:
    """The spans of an OTLP file in any of the three layouts of the module docstring."""
    raw = path.read_bytes()
    if raw.lstrip()[:1] == b"{":
        spans: list[OtlpSpan] = []
        for n, line in enumerate(raw.splitlines(), start=1):
            if line.strip():
                try:
                    spans += parse_spans(line, "otlp_json")
                except OtlpDecodeError as exc:
                    raise SpanSourceError(f"{path}:{n}: {exc}") from None
        return spans
    try:
        return _length_prefixed(raw)
    except (OtlpDecodeError, struct.error):
        try:
            return parse_spans(raw, "otlp_proto")
        except OtlpDecodeError as exc:
            raise SpanSourceError(f"{path}: neither OTLP/JSON lines nor OTLP protobuf: {exc}") from None


def _length_prefixed(raw: bytes) -> list[OtlpSpan]:
    spans: list[OtlpSpan] = []
    at = 0
    while at < len(raw):
        (size,) = _LENGTH.unpack_from(raw, at)
        if at + 4 + size > len(raw):
            raise OtlpDecodeError("a length runs past the end")
        spans += parse_spans(raw[at + 4 : at + 4 + size], "otlp_proto")
        at += 4 + size
    return spans


def last_traces(messages: Sequence[list[OtlpSpan]], traces: int, cut: set[str] | None = None) -> list[OtlpSpan]:
    """The spans of the ``traces`` most recent traces (by their latest span end; ``messages`` in reading order),
    leaving out the trace ids in ``cut`` (possibly begun before what was read)."""
    latest: dict[str, int] = {}
    for spans in messages:
        for span in spans:
            latest[span.trace_id] = max(latest.get(span.trace_id, span.end_ns), span.end_ns)
    ranked = sorted((t for t in latest if not cut or t not in cut), key=lambda t: (latest[t], t))
    wanted = set(ranked[-traces:])
    return [s for spans in messages for s in spans if s.trace_id in wanted]


async def read_topic_traces(
    settings: Settings, traces: int, *, timeout_s: float = 30.0, stats: TailStats | None = None
) -> list[OtlpSpan]:
    """The spans of the last ``traces`` whole traces on the span topic (module docstring); ``stats`` counts the
    messages of the last (widest) tail read."""
    topic, encoding = settings.otlp.topic, settings.otlp.encoding
    tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings))
    await consumer.start()
    try:
        consumer.assign(tps)
        begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        window = max(4 * traces // len(tps), 1) + _EDGE_MESSAGES
        deadline = time.monotonic() + timeout_s
        while True:
            starts = {tp: max(begins[tp], ends[tp] - window) for tp in tps}
            edges = {tp: start + _EDGE_MESSAGES if start > begins[tp] else start for tp, start in starts.items()}
            tail = TailStats()
            messages, cut = await _read_tail(
                consumer, starts, ends, edges, encoding, deadline, settings.otlp.tenant_source, tail
            )
            if stats is not None:
                stats.messages, stats.unkeyed, stats.example = tail.messages, tail.unkeyed, tail.example
            whole = all(starts[tp] == begins[tp] for tp in tps)
            found = len({s.trace_id for spans in messages for s in spans} - cut)
            if found >= traces or whole:
                return last_traces(messages, traces, cut)
            window *= 4
    finally:
        await consumer.stop()


async def _read_tail(
    consumer: AIOKafkaConsumer,
    starts: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
    edges: dict[TopicPartition, int],
    encoding: OtlpEncoding,
    deadline: float,
    tenant_source: TenantSource = "attributes",
    stats: TailStats | None = None,
) -> tuple[list[list[OtlpSpan]], set[str]]:
    """Every message from ``starts`` to ``ends`` (partitions one after another), decoded; a message that does
    not decode is skipped (the worker dead-letters it). Also the trace ids seen before ``edges`` (a tail's
    cut head)."""
    messages: list[list[OtlpSpan]] = []
    cut: set[str] = set()
    for tp, start in starts.items():
        consumer.seek(tp, start)
        while await consumer.position(tp) < ends[tp]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {tp.topic} took too long")
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=2_000)
            for record in batch.get(tp, []):
                if record.offset >= ends[tp]:
                    break
                try:
                    spans = parse_spans(record.value or b"", encoding, tenant_source)
                except OtlpDecodeError:
                    continue
                messages.append(spans)
                if stats is not None:
                    stats.messages += 1
                    if not keyed_by_trace(record.key, spans):
                        stats.unkeyed += 1
                        stats.example = stats.example or f"{tp.topic}:{tp.partition}:{record.offset}"
                if record.offset < edges[tp]:
                    cut.update(s.trace_id for s in spans)
    return messages, cut


def read_topic(settings: Settings, traces: int, stats: TailStats | None = None) -> list[OtlpSpan]:
    """:func:`read_topic_traces`, run to completion."""
    return asyncio.run(read_topic_traces(settings, traces, stats=stats))


def report_lines(source: str, spans: int, reports: list[ScopeReport], findings: list[TraceFinding]) -> list[str]:
    """The text report: per scope, its traces and statuses, the source of each stage, and what is missing."""
    complete = sum(r.complete for r in reports)
    lines = [f"{len(findings)} traces ({spans} spans) from {source}: {complete} complete requests"]
    for r in reports:
        name, version = r.scope
        others = ", ".join(f"{s} {n}" for s, n in sorted(r.statuses.items()) if s != "complete")
        lines.append("")
        lines.append(f"{name or '(unnamed scope)'} {version}".rstrip() + f": {r.traces} traces, {r.complete} complete")
        if others:
            lines[-1] += f" ({others})"
        for stage, sources in r.stages.items():
            for source, n in sources.most_common():
                lines.append(f"  {stage:<16} {source} ({n})")
        for what, n in r.nested.most_common():
            lines.append(f"  counted once     {what} ({n})")
        if r.steps:
            lines.append(
                f"  steps            {r.steps} LLM calls before the answer in {r.traces_with_steps} traces "
                "(a tool call, a question rewritten before the retrieval): their whole time is llm_ttft, the "
                "answering call's first chunk the first token"
            )
        lines.append("  tenant           " + ", ".join(f"{t} ({n})" for t, n in r.tenant.most_common()))
        if not r.missing:
            lines.append("  missing          nothing")
        for what, n in r.missing.most_common():
            lines.append(f"  missing          {what} ({n} traces, e.g. {r.examples[what][0]})")
            lines.append(f"    fix: {fix_for(what, name)}")
    return lines
