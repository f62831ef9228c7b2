"""Bound producers: the Kafka ACL that lets a tenant's principal write its own input topic and nothing else.

With ``bound_tenants`` set, the join also reads ``<prefix>.stage-events.<tenant>`` for each of them and
dead-letters (``tenant_not_allowed``) an event there that claims another tenant, or a bound tenant's event
on the shared topic (:mod:`streams.app.join_fold`). What stops a principal from writing *another* tenant's
topic is the broker: a prefixed ACL per tenant principal, granted here (the same as ``kafka-acls.sh --add
--allow-principal User:<principal> --operation Write --topic <prefix>.stage-events.<tenant>
--resource-pattern-type prefixed``), on a broker running an authorizer (KRaft: ``StandardAuthorizer``).

aiokafka has no ACL admin call, so this sends the CreateAcls request (API key 30, version 1: the first
with pattern types) itself through the admin client's connection.
"""

from __future__ import annotations

from typing import Final

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest

from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings

#: Kafka's protocol codes (org.apache.kafka.common.resource / acl).
RESOURCE_TOPIC: Final = 2
PATTERN_PREFIXED: Final = 4
OPERATION_WRITE: Final = 4
PERMISSION_ALLOW: Final = 3


class AclError(RuntimeError):
    """The broker refused to create an ACL (no authorizer, not authorized to alter ACLs, ...)."""


def bound_topic(settings: Settings, tenant: str) -> str:
    """The input topic bound to ``tenant``: ``<prefix>.stage-events.<tenant>``."""
    return settings.topic(f"stage-events.{tenant}")


async def grant_bound_producer(settings: Settings, tenant: str, principal: str, *, timeout_s: float = 30.0) -> None:
    """Allow ``User:<principal>`` to write the topics prefixed ``<prefix>.stage-events.<tenant>`` (its bound
    topic), and nothing else this grant covers. Idempotent: the broker keeps one copy of an equal ACL."""
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout_s * 1000), **kafka_client_kwargs(settings))
    await admin.start()
    try:
        request = CreateAclsRequest(
            RESOURCE_TOPIC,
            bound_topic(settings, tenant),
            PATTERN_PREFIXED,
            f"User:{principal}",
            "*",
            OPERATION_WRITE,
            PERMISSION_ALLOW,
        )
        response = await admin._send_request(request)
    finally:
        await admin.close()
    for result in response.creation_responses:
        code, message = result[0], result[1]
        if code:
            raise AclError(
                f"ACL for {principal} on {bound_topic(settings, tenant)}*: {for_code(code).__name__} {message}"
            )
