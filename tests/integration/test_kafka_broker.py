"""The local Kafka 4.x broker: readiness, explicit topics, round trips, the CLI, restart and SASL."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from pydantic import SecretStr

from streams.kafka.broker import LocalBroker, missing_prerequisite
from streams.kafka.topics import ensure_topics, faust_broker_kwargs, kafka_client_kwargs, wait_for_broker
from streams.ports import free_port
from streams.settings import TOPIC_NAMES, Settings, load_settings
from tests.fixtures.kafka import KafkaBrokerHandle

kafka = pytest.mark.kafka


async def _produce(settings: Settings, topic: str, items: list[tuple[bytes, bytes]], timeout_ms: int = 5_000) -> None:
    producer = AIOKafkaProducer(request_timeout_ms=timeout_ms, **kafka_client_kwargs(settings))
    await producer.start()
    try:
        for key, value in items:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def _consume(settings: Settings, topic: str, n: int, timeout_s: float = 20.0) -> list[tuple[bytes, bytes]]:
    consumer = AIOKafkaConsumer(
        topic, auto_offset_reset="earliest", enable_auto_commit=False, **kafka_client_kwargs(settings)
    )
    await consumer.start()
    got: list[tuple[bytes, bytes]] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(got) < n:
                batch = await consumer.getmany(timeout_ms=500)
                got += [(m.key or b"", m.value or b"") for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()
    return got


async def _partition_counts(settings: Settings) -> dict[str, int]:
    admin = AIOKafkaAdminClient(**kafka_client_kwargs(settings))
    await admin.start()
    try:
        described = await admin.describe_topics([settings.topic(n) for n in TOPIC_NAMES])
    finally:
        await admin.close()
    return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}


# --- client argument mapping (pure) -------------------------------------------------------------


def test_plaintext_kwargs_are_minimal() -> None:
    settings = load_settings(kafka_bootstrap="a:1,b:2")
    assert kafka_client_kwargs(settings) == {"bootstrap_servers": "a:1,b:2", "security_protocol": "PLAINTEXT"}
    assert faust_broker_kwargs(settings) == {"broker": "kafka://a:1;kafka://b:2"}


def test_sasl_ssl_kwargs_carry_credentials_and_context() -> None:
    settings = load_settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="svc",
        kafka_sasl_password=SecretStr("s3cret"),
    )
    kwargs = kafka_client_kwargs(settings)
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("svc", "s3cret")
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    creds = faust_broker_kwargs(settings)["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("svc", "s3cret", "SCRAM-SHA-512")
    assert creds.protocol.value == "SASL_SSL"


def test_ssl_kwargs_give_faust_ssl_credentials() -> None:
    creds = faust_broker_kwargs(load_settings(kafka_security_protocol="SSL"))["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials)


# --- the real broker ----------------------------------------------------------------------------


@kafka
@pytest.mark.timeout(120)
def test_broker_answers_metadata(kafka_broker: KafkaBrokerHandle) -> None:
    kafka_broker.ensure_running()
    cluster = asyncio.run(wait_for_broker(kafka_broker.bootstrap, timeout_s=10))
    assert [b["node_id"] for b in cluster["brokers"]] == [1]
    assert kafka_broker.broker.status().running
    assert kafka_broker.ready_seconds and kafka_broker.ready_seconds[0] < 60


@kafka
@pytest.mark.timeout(120)
def test_topics_are_created_with_configured_partitions(kafka_settings: Settings) -> None:
    counts = asyncio.run(_partition_counts(kafka_settings))
    assert counts == {kafka_settings.topic(n): 8 for n in TOPIC_NAMES}
    # Idempotent: a second run creates nothing and does not fail.
    assert asyncio.run(ensure_topics(kafka_settings)) == []


@kafka
@pytest.mark.timeout(120)
def test_unknown_topic_is_not_auto_created(kafka_settings: Settings) -> None:
    unknown = kafka_settings.topic("no-such-topic")
    with pytest.raises(KafkaError):
        asyncio.run(_produce(kafka_settings, unknown, [(b"k", b"v")], timeout_ms=2_000))

    async def topics() -> list[str]:
        admin = AIOKafkaAdminClient(**kafka_client_kwargs(kafka_settings))
        await admin.start()
        try:
            return list(await admin.list_topics())
        finally:
            await admin.close()

    assert unknown not in asyncio.run(topics())


@kafka
@pytest.mark.timeout(120)
def test_produce_consume_round_trip(kafka_settings: Settings) -> None:
    topic = kafka_settings.topic("stage-events")
    sent = [(f"req-{i}".encode(), f'{{"i": {i}, "tenant_id": "tënant"}}'.encode()) for i in range(20)]
    asyncio.run(_produce(kafka_settings, topic, sent))
    got = asyncio.run(_consume(kafka_settings, topic, len(sent)))
    assert sorted(got) == sorted(sent)


@kafka
@pytest.mark.timeout(240)
def test_cli_up_status_down(tmp_path: Path) -> None:
    if reason := missing_prerequisite():
        pytest.skip(reason)
    port = free_port()
    env = {**os.environ, "TTFT_HOME": str(tmp_path), "TTFT_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"}
    env.pop("TTFT_TOPIC_PREFIX", None)

    def ttft(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "streams.cli.main", "kafka", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, check=False)

    try:
        assert ttft("status").returncode == 1
        up = ttft("up")
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
        status = ttft("status")
        assert status.returncode == 0 and "runs" in status.stdout
        settings = load_settings(kafka_bootstrap=f"127.0.0.1:{port}", topic_prefix="ttft")
        assert set(asyncio.run(_partition_counts(settings)).values()) == {8}
        again = ttft("up")  # idempotent while running
        assert again.returncode == 0 and "already up" in again.stdout
        down = ttft("down")
        assert down.returncode == 0 and "stopped" in down.stdout
        assert ttft("status").returncode == 1
    finally:
        LocalBroker(tmp_path / "kafka").stop(timeout_s=10)


@kafka
@pytest.mark.timeout(240)
def test_sasl_plain_and_scram_listener(tmp_path: Path) -> None:
    if reason := missing_prerequisite():
        pytest.skip(reason)
    broker = LocalBroker(
        tmp_path / "sasl",
        sasl_users={"alice": "alice-secret"},
        heap_mb=384,
        jvm_options=["-XX:TieredStopAtLevel=1"],
    )
    broker.start()
    try:
        plain_admin = load_settings(kafka_bootstrap=broker.bootstrap, topic_prefix=f"s{uuid.uuid4().hex[:8]}")
        asyncio.run(ensure_topics(plain_admin, ["stage-events"]))
        topic = plain_admin.topic("stage-events")
        for mechanism in ("PLAIN", "SCRAM-SHA-256"):
            good = load_settings(
                kafka_bootstrap=broker.sasl_bootstrap,
                kafka_security_protocol="SASL_PLAINTEXT",
                kafka_sasl_mechanism=mechanism,
                kafka_sasl_username="alice",
                kafka_sasl_password=SecretStr("alice-secret"),
            )
            asyncio.run(_produce(good, topic, [(mechanism.encode(), b"ok")]))
            bad = good.model_copy(update={"kafka_sasl_password": SecretStr("wrong")})
            with pytest.raises(KafkaError):
                asyncio.run(_produce(bad, topic, [(b"x", b"denied")]))
        got = asyncio.run(_consume(plain_admin, topic, 2))
        assert sorted(k for k, _ in got) == [b"PLAIN", b"SCRAM-SHA-256"]
    finally:
        broker.stop(timeout_s=10)


@kafka
@pytest.mark.timeout(240)
def test_restart_on_same_data_keeps_messages(kafka_broker: KafkaBrokerHandle, kafka_settings: Settings) -> None:
    topic = kafka_settings.topic("requests")
    asyncio.run(_produce(kafka_settings, topic, [(b"req-1", b"before restart")]))
    port, data = kafka_broker.bootstrap, kafka_broker.data_dir
    kafka_broker.stop()
    assert not kafka_broker.broker.status().running
    kafka_broker.start()
    assert (kafka_broker.bootstrap, kafka_broker.data_dir) == (port, data)
    assert asyncio.run(_consume(kafka_settings, topic, 1)) == [(b"req-1", b"before restart")]


class _PortThief(LocalBroker):
    """Binds the broker's picked port between the pick and the JVM's start, once: another process did this."""

    stolen: list[int]

    def _launch(self) -> None:
        if not self.stolen:
            thief = socket.socket()
            thief.bind((self.host, self.port))
            thief.listen()
            self.stolen.append(self.port)
            self._thief = thief
        super()._launch()


@kafka
@pytest.mark.timeout(240)
def test_a_picked_port_taken_before_the_bind_is_picked_again(tmp_path: Path) -> None:
    if reason := missing_prerequisite():
        pytest.skip(reason)
    broker = _PortThief(tmp_path / "thief", heap_mb=256, jvm_options=["-XX:TieredStopAtLevel=1"])
    broker.stolen = []
    try:
        broker.start()
        assert broker.stolen and broker.port != broker.stolen[0]
        assert asyncio.run(wait_for_broker(broker.bootstrap, timeout_s=10))
    finally:
        broker.stop(timeout_s=10)
        broker._thief.close()
