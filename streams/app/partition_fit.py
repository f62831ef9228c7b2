"""A worker's partition count fitted to the topics it reads, before its folds are built.

``partitions`` (``TTFT_PARTITIONS``) sizes the topics the workers create, the join's state changelogs and
its partition numbering; a topic that already exists keeps its own count (docs/operations.md, "Sizing
partitions and workers"). A stage-events or span topic with more partitions than the setting (created by
hand, or grown to scale out) made the join write state to changelog partitions that do not exist: it exited
on restoring them, after a 40 s timeout, and again after every restart. Now the worker takes the largest
count of its input topics, says so in its log, and creates or grows its changelogs to match.

With bound tenants' topics the count also numbers their partitions in the join's state (``slot *
partitions + p``), so it cannot follow the topics silently: the worker stops with the setting to use.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from aiokafka.admin import AIOKafkaAdminClient

from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.worker")


class PartitionsMismatch(SystemExit):
    """The input topics need more partitions than ``TTFT_PARTITIONS`` says, and bound topics forbid adapting."""


def input_topics_of(settings: Settings, role: str) -> list[str]:
    """The topics a role's runners consume."""
    if role == "join":
        topics = [settings.topic("stage-events"), *settings.bound_topics()]
        return [*topics, settings.otlp.topic] if settings.otlp.enabled else topics
    return [settings.topic("requests"), settings.topic("dead-letter")]


async def partition_counts(settings: Settings, topics: list[str], timeout_s: float = 5.0) -> dict[str, int]:
    """Partitions of each of ``topics`` that exists (a missing one is left out)."""
    admin = AIOKafkaAdminClient(**kafka_client_kwargs(settings), request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        described = await asyncio.wait_for(admin.describe_topics(topics), timeout_s)
    finally:
        await admin.close()
    return {
        str(entry["topic"]): len(entry["partitions"])
        for entry in described
        if not entry.get("error_code") and entry.get("partitions")
    }


def fitted(settings: Settings, counts: dict[str, int]) -> Settings:
    """``settings`` with ``partitions`` raised to the largest of ``counts`` (unchanged when none is larger)."""
    topic, most = max(counts.items(), key=lambda item: item[1], default=("", 0))
    if most <= settings.partitions:
        return settings
    if settings.bound_topics():
        raise PartitionsMismatch(
            f"topic {topic} has {most} partitions but TTFT_PARTITIONS is {settings.partitions}; with bound tenants' "
            f"topics the join numbers its state by it, so it cannot adapt: set TTFT_PARTITIONS={most} on every worker"
        )
    log.warning(
        "topic %s has %d partitions, TTFT_PARTITIONS says %d: this worker uses %d (its state changelogs are created "
        "or grown to match); set TTFT_PARTITIONS=%d to say so",
        topic,
        most,
        settings.partitions,
        most,
        most,
    )
    return settings.model_copy(update={"partitions": most})


def fit_partitions(settings: Settings, role: str) -> Settings:
    """:func:`fitted` to what the broker says now; unchanged when it cannot be asked (the worker's own start
    then meets the same broker and reports it)."""
    topics = input_topics_of(settings, role)
    try:
        # In a thread of its own: the worker's event loop is not made yet, and this one must not become it.
        with ThreadPoolExecutor(1) as pool:
            counts = pool.submit(asyncio.run, partition_counts(settings, topics)).result()
    except Exception as exc:  # the broker is not up yet: the topics will be created with the setting
        log.info("partition counts not read before start (%s): TTFT_PARTITIONS=%d", exc, settings.partitions)
        return settings
    return fitted(settings, counts)
