"""Issue 27 item 7: bound producers on a real broker with SASL and ACLs (KRaft's StandardAuthorizer).

The broker offers SASL_PLAINTEXT (PLAIN) for three principals: ``ttft-svc`` (the pipeline, a super user),
``acme`` (a tenant bound to ``<prefix>.stage-events.acme`` by a prefixed Write ACL) and ``mallory`` (no ACL).
acme's events on its topic are stored; the events acme writes there claiming another tenant, and an acme
event smuggled onto the shared topic, are dead-lettered ``tenant_not_allowed``; mallory is refused by the
broker on acme's topic, and acme on the shared topic.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from pydantic import SecretStr

from streams.kafka.acls import bound_topic, grant_bound_producer
from streams.kafka.broker import LocalBroker, missing_prerequisite
from streams.kafka.topics import ensure_topics, kafka_client_kwargs
from streams.ports import free_port
from streams.settings import Settings, load_settings
from tests.support.pipeline import Pipeline, group_lag, pipeline_env
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.clickhouse, pytest.mark.timeout(420)]

SERVICE = "ttft-svc"


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBroker, dict[str, str]]]:
    """A broker with an authorizer: ANONYMOUS (its own PLAINTEXT listeners) and ttft-svc are super users."""
    if reason := missing_prerequisite():
        pytest.skip(f"no local Kafka broker: {reason}")
    users = {name: f"{name}-{uuid.uuid4().hex}" for name in (SERVICE, "acme", "mallory")}
    broker = LocalBroker(
        tmp_path_factory.mktemp("acl") / "broker",
        sasl_users=users,
        heap_mb=384,
        jvm_options=["-XX:TieredStopAtLevel=1"],
        extra_config={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:ANONYMOUS;User:{SERVICE}",
            "allow.everyone.if.no.acl.found": "false",
        },
    )
    broker.start()
    try:
        yield broker, users
    finally:
        broker.stop(timeout_s=10)


def _as(settings: Settings, user: str, password: str) -> Settings:
    return settings.model_copy(
        update={
            "kafka_sasl_username": user,
            "kafka_sasl_password": SecretStr(password),
        }
    )


async def _produce(settings: Settings, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(linger_ms=5, acks="all", request_timeout_ms=15_000, **kafka_client_kwargs(settings))
    await producer.start()
    try:
        pending = [await producer.send(topic, value=v, key=k) for k, v in messages]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _retenant(messages: list[tuple[bytes, bytes]], tenant: str, prefix: str) -> list[tuple[bytes, bytes]]:
    out = []
    for _, value in messages:
        event = orjson.loads(value)
        event["tenant_id"], event["request_id"] = tenant, f"{prefix}{event['request_id']}"
        out.append((event["request_id"].encode(), orjson.dumps(event)))
    return out


def test_a_bound_principal_cannot_write_as_another_tenant_and_others_cannot_write_its_topic(
    acl_broker: tuple[LocalBroker, dict[str, str]], tmp_path: Path
) -> None:
    broker, users = acl_broker
    assert broker.sasl_bootstrap is not None
    prefix = f"b{uuid.uuid4().hex[:8]}"
    service = load_settings(
        kafka_bootstrap=broker.sasl_bootstrap,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username=SERVICE,
        kafka_sasl_password=SecretStr(users[SERVICE]),
        home=tmp_path,
        topic_prefix=prefix,
        app_id=prefix,
        bound_tenants=("acme",),
    )
    asyncio.run(ensure_topics(service))
    asyncio.run(grant_bound_producer(service, "acme", "acme"))
    acme, mallory = _as(service, "acme", users["acme"]), _as(service, "mallory", users["mallory"])
    own_topic, shared = bound_topic(service, "acme"), service.topic("stage-events")

    start = time.time() * 1000 - 60_000
    traffic = build_traffic(60, start_ms=start, malformed_share=0.0, dup_share=0.0, missing_share=0.0, orphan_share=0.0)
    own = _retenant(traffic.messages[: len(traffic.messages) // 2], "acme", "own-")
    forged = _retenant(traffic.messages[len(traffic.messages) // 2 :], "globex", "forged-")
    asyncio.run(_produce(acme, own_topic, own + forged))  # acme may write its topic, whatever it claims
    smuggled = _retenant(traffic.messages[:7], "acme", "smuggled-")
    shared_good = _retenant(traffic.messages, "initech", "shared-")
    asyncio.run(_produce(service, shared, shared_good + smuggled))

    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(_produce(mallory, own_topic, own[:1]))
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(_produce(acme, shared, own[:1]))

    env = pipeline_env(
        service,
        tmp_path,
        TTFT_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        TTFT_KAFKA_SASL_MECHANISM="PLAIN",
        TTFT_KAFKA_SASL_USERNAME=SERVICE,
        TTFT_KAFKA_SASL_PASSWORD=users[SERVICE],
        TTFT_BOUND_TENANTS="acme",
    )
    pipe = Pipeline(env, tmp_path)
    app = f"app-{prefix}"
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)

        def drained() -> bool:  # asked on the broker's own PLAINTEXT listener (ANONYMOUS is a super user)
            plain = broker.bootstrap
            outputs = [service.topic("requests"), service.topic("dead-letter")]
            return (
                group_lag(plain, f"{app}-join", [shared, own_topic]) == 0
                and join.metric("ttft_open_requests") == 0
                and group_lag(plain, f"{app}-writer", outputs) == 0
            )

        pipe.wait_for(drained, 180, "the pipeline to drain")
        assert join.metrics()['ttft_dead_letters_total{reason="tenant_not_allowed"}'] == len(forged) + len(smuggled)
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    rows = pipe.query("SELECT tenant_id, status, count() AS n FROM {db}.requests FINAL GROUP BY tenant_id, status")
    assert {(r["tenant_id"], r["status"]): int(r["n"]) for r in rows} == {
        ("acme", "complete"): 30,
        ("initech", "complete"): 60,
    }
    letters = pipe.query(
        "SELECT source_topic, tenant_id, count() AS n FROM {db}.dead_letters FINAL "
        "WHERE reason_code = 'tenant_not_allowed' GROUP BY source_topic, tenant_id"
    )
    assert {(r["source_topic"], r["tenant_id"]): int(r["n"]) for r in letters} == {
        (own_topic, "acme"): len(forged),
        (shared, None): len(smuggled),
    }


def test_binding_a_tenant_grows_an_existing_join_changelog(kafka_settings: Settings) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from streams.app.join_fold import changelog_topic, join_runner_config
    from streams.kafka.batches import CHANGELOG_CONFIGS
    from streams.kafka.topics import ensure_named_topics

    changelog = changelog_topic(kafka_settings)
    asyncio.run(ensure_named_topics(kafka_settings, {changelog: CHANGELOG_CONFIGS}))  # before any binding: 8
    bound = kafka_settings.model_copy(update={"bound_tenants": ("acme", "globex")})
    wanted = join_runner_config(bound).changelog_partitions
    assert wanted == 3 * kafka_settings.partitions
    asyncio.run(ensure_named_topics(bound, {changelog: CHANGELOG_CONFIGS}, partitions=wanted))

    async def partitions() -> int:
        admin = AIOKafkaAdminClient(**kafka_client_kwargs(kafka_settings))
        await admin.start()
        try:
            (described,) = await admin.describe_topics([changelog])
        finally:
            await admin.close()
        return len(described["partitions"])

    assert asyncio.run(partitions()) == wanted
