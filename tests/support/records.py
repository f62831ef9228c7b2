"""Request records as the join emits them, minimal and valid, for store and writer tests."""

from __future__ import annotations

from typing import Any

from schemas.records import RequestRecord, record_version
from tests.support.recent import RECENT_DAY_MS

WINDOW_MS = 60_000


def make_record(request_id: str, **fields: Any) -> dict[str, Any]:
    """A validated record dict: complete, 5 events, tenant ``acme``, unless ``fields`` say otherwise."""
    status = fields.pop("status", "complete")
    events = fields.pop("event_count", 5)
    started = fields.pop("started_at", RECENT_DAY_MS + 1_234.0)
    base: dict[str, Any] = {
        "request_id": request_id,
        "tenant_id": "acme",
        "status": status,
        "started_at": started,
        "window_start": float(started // WINDOW_MS * WINDOW_MS),
        "event_count": events,
        "record_version": record_version(events, status, fields.get("late_events", 0)),
    }
    return RequestRecord(**{**base, **fields}).model_dump()
