"""Kafka connection settings and the project's topics.

The broker runs with ``auto.create.topics.enable=false``: every topic of docs/design.md is created here, on
purpose, with ``settings.partitions`` partitions. ``kafka_client_kwargs`` / ``faust_broker_kwargs`` are the
one place where the security settings turn into client arguments, so aiokafka producers, admin clients and
the faust app always connect the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from aiokafka.helpers import create_ssl_context

from streams.settings import TOPIC_NAMES, Settings


class TopicSetupError(RuntimeError):
    """A topic could not be created for a reason other than already existing."""


def kafka_client_kwargs(settings: Settings) -> dict[str, Any]:
    """aiokafka keyword arguments (producer, consumer, admin client) for ``settings``."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "security_protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        cafile = str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
        kwargs["ssl_context"] = create_ssl_context(cafile=cafile)
    if settings.kafka_security_protocol.startswith("SASL"):
        kwargs["sasl_mechanism"] = settings.kafka_sasl_mechanism
        kwargs["sasl_plain_username"] = settings.kafka_sasl_username
        password = settings.kafka_sasl_password
        kwargs["sasl_plain_password"] = password.get_secret_value() if password else None
    return kwargs


def faust_broker_kwargs(settings: Settings) -> dict[str, Any]:
    """``faust.App`` keyword arguments: ``broker`` URL(s) and, when needed, ``broker_credentials``."""
    import faust  # imported here: the admin/test paths should not pay for faust's import

    hosts = [h.strip() for h in settings.kafka_bootstrap.split(",") if h.strip()]
    kwargs: dict[str, Any] = {"broker": ";".join(f"kafka://{h}" for h in hosts)}
    protocol = settings.kafka_security_protocol
    ssl_context = kafka_client_kwargs(settings).get("ssl_context")
    if protocol.startswith("SASL"):
        password = settings.kafka_sasl_password
        # SASLCredentials switches itself to SASL_SSL when it is given an SSL context.
        kwargs["broker_credentials"] = faust.SASLCredentials(
            username=settings.kafka_sasl_username,
            password=password.get_secret_value() if password else None,
            mechanism=settings.kafka_sasl_mechanism,
            ssl_context=ssl_context,
        )
    elif protocol == "SSL":
        kwargs["broker_credentials"] = faust.SSLCredentials(ssl_context)
    return kwargs


async def wait_for_broker(
    bootstrap: str,
    timeout_s: float = 60.0,
    *,
    attempts: int | None = None,
    **client_kwargs: Any,
) -> dict[str, Any]:
    """Wait until ``bootstrap`` answers a metadata request that lists at least one broker.

    Returns aiokafka's cluster description (``brokers``, ``controller_id``, ...). Retries every 0.25 s
    until ``timeout_s`` (or ``attempts`` tries) are used up, then raises :class:`TimeoutError` with the
    last error. ``client_kwargs`` are extra aiokafka arguments, e.g. from :func:`kafka_client_kwargs`.
    """
    deadline = time.monotonic() + timeout_s
    tries = 0
    last: BaseException | None = None
    while True:
        tries += 1
        try:
            return await _describe_cluster(bootstrap, deadline, client_kwargs)
        except (TimeoutError, KafkaError, OSError) as exc:
            last = exc
        if time.monotonic() >= deadline or (attempts is not None and tries >= attempts):
            raise TimeoutError(f"kafka at {bootstrap} not ready after {timeout_s:.0f}s: {last!r}")
        await asyncio.sleep(0.25)


async def _describe_cluster(bootstrap: str, deadline: float, client_kwargs: dict[str, Any]) -> dict[str, Any]:
    if not await _any_port_open(bootstrap):
        # Nothing listens yet: skip the client, whose connect errors would flood the log.
        raise ConnectionRefusedError(f"nothing listens on {bootstrap}")
    remaining = max(deadline - time.monotonic(), 1.0)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(min(remaining, 10.0) * 1000), **client_kwargs
    )
    try:
        await asyncio.wait_for(admin.start(), timeout=remaining)
        cluster: dict[str, Any] = await asyncio.wait_for(admin.describe_cluster(), timeout=remaining)
    finally:
        await admin.close()
    if not cluster.get("brokers"):
        raise KafkaError("metadata lists no brokers yet")
    return cluster


async def _any_port_open(bootstrap: str) -> bool:
    for hostport in bootstrap.split(","):
        host, _, port = hostport.strip().rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), 2.0)
        except (TimeoutError, OSError, ValueError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


async def ensure_topics(
    settings: Settings,
    names: Iterable[str] = TOPIC_NAMES,
    *,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the project's topics (``settings.topic(name)``) if missing; return the ones created now.

    Each gets ``settings.partitions`` partitions and ``settings.replication_factor`` replicas. A topic that
    already exists is left as it is (its partition count is not checked or changed). With the OTLP input
    enabled, its topic (``settings.otlp.topic``, unprefixed: the Collector's name) is declared too, since
    the kafkaexporter does not create it; so is each bound tenant's input topic (``settings.bound_topics``).
    """
    names = tuple(names)
    topics = {settings.topic(name): _topic_configs(settings.topic(name), settings) for name in names}
    if "stage-events" in names:
        topics.update({topic: {} for topic in settings.bound_topics()})
    if settings.otlp.enabled:
        topics[settings.otlp.topic] = {}
    return await ensure_named_topics(settings, topics, timeout_s=timeout_s)


async def ensure_named_topics(
    settings: Settings,
    topics: Mapping[str, dict[str, str]],
    *,
    timeout_s: float = 30.0,
    partitions: int | None = None,
) -> list[str]:
    """Create topics by their full names with their configs if missing (see :func:`ensure_topics`), with
    ``partitions`` partitions (default ``settings.partitions``). With ``partitions`` given, an existing topic
    with fewer is grown to it (a changelog whose partitions are chosen by the writer, never by key)."""
    count = partitions or settings.partitions
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout_s * 1000), **kafka_client_kwargs(settings))
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        wanted = [t for t in topics if t not in existing]
        if partitions is not None:
            await _grow(admin, [t for t in topics if t in existing], partitions, timeout_s)
        created: list[str] = []
        if not wanted:
            return created
        response = await admin.create_topics(
            [NewTopic(t, count, settings.replication_factor, topic_configs=topics[t]) for t in wanted],
            timeout_ms=int(timeout_s * 1000),
        )
        errors: list[str] = []
        for entry in response.topic_errors:
            topic, code = entry[0], entry[1]
            if code == 0:
                created.append(topic)
            elif code != TopicAlreadyExistsError.errno:  # lost a race with another creator: fine
                message = entry[2] if len(entry) > 2 and entry[2] else for_code(code).__name__
                errors.append(f"{topic}: {message}")
        if errors:
            raise TopicSetupError("could not create topics: " + "; ".join(errors))
    finally:
        await admin.close()
    await _await_leaders(settings, created, timeout_s)
    return created


async def _grow(admin: AIOKafkaAdminClient, topics: list[str], partitions: int, timeout_s: float) -> None:
    """Add partitions to ``topics`` that have fewer than ``partitions``."""
    if not topics:
        return
    grow = {
        str(t["topic"]): NewPartitions(partitions)
        for t in await admin.describe_topics(topics)
        if len(t.get("partitions") or ()) < partitions
    }
    if grow:
        await admin.create_partitions(grow, timeout_ms=int(timeout_s * 1000))


def _topic_configs(topic: str, settings: Settings) -> dict[str, str]:
    """Per-topic configs: the alert outbox is compacted by fingerprint (the delivery loop reads it whole), and
    the rule evaluations by series (``ttft rules status`` reads the latest evaluation of each)."""
    if topic == settings.topic("alerts"):
        return {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"}
    if topic == settings.topic("rule-evaluations"):
        return {"cleanup.policy": "compact", "min.compaction.lag.ms": "600000"}
    return {}


async def _await_leaders(settings: Settings, topics: list[str], timeout_s: float) -> None:
    """Return once every partition of ``topics`` answers ListOffsets from its leader.

    CreateTopics answers before the broker has taken leadership of the new partitions; a producer that
    starts right away gets NotLeaderForPartition retries (noise, and delay). aiokafka's ``end_offsets``
    retries those errors itself until its request timeout.
    """
    if not topics:
        return
    partitions = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False, request_timeout_ms=int(timeout_s * 1000), **kafka_client_kwargs(settings)
    )
    await consumer.start()
    try:
        await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
