"""The stage event as it goes to Kafka: compact UTF-8 JSON, keyed by the request id (docs/emitting.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson

DEFAULT_TOPIC: Final = "ttft.stage-events"

Rollout = Literal["stable", "canary"]


def event_json(
    request_id: str,
    tenant_id: str,
    stage: str,
    ts_ms: float,
    duration_ms: float | None = None,
    *,
    version_id: str | None = None,
    route: str | None = None,
    rollout: Rollout | None = None,
    fallback_level: int | None = None,
    event_id: str | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> bytes:
    """The Kafka value of one stage event: compact UTF-8 JSON, absent fields omitted.

    The Kafka key is ``request_id.encode("utf-8")``. Raises ``TypeError`` when ``attrs`` holds a value
    JSON cannot represent (the emitters catch it and count the event as ``invalid``).
    """
    event: dict[str, Any] = {"request_id": request_id, "tenant_id": tenant_id, "stage": stage, "ts_ms": ts_ms}
    if duration_ms is not None:
        event["duration_ms"] = duration_ms
    if version_id is not None:
        event["version_id"] = version_id
    if route is not None:
        event["route"] = route
    if rollout is not None:
        event["rollout"] = rollout
    if fallback_level is not None:
        event["fallback_level"] = fallback_level
    if event_id is not None:
        event["event_id"] = event_id
    if attrs:
        event["attrs"] = dict(attrs)
    return orjson.dumps(event)
