"""Baseline B: the join as the Faust documentation would have you write it. Run as a Faust worker process.

Idiomatic and honest, not a straw man: events arrive as a ``faust.Record`` (Faust's JSON codec, orjson
when installed, as it is here), one ``Table`` keyed by request id holds a ``faust.Record`` per open
request, every event reads it, folds itself in and writes it back (one changelog message per event), a
complete request is sent to the output topic and deleted from the table, and each event is acknowledged
as the ``async for`` moves on. It does *less* than our join: no validation or dead letters, no grace
period or watermark (a request is emitted the moment its last required stage arrives), no timeouts.

Configured by environment (set by :mod:`bench.baseline_faust_naive`): ``BENCH_NAIVE_BROKER``,
``BENCH_NAIVE_APP_ID``, ``BENCH_NAIVE_EVENTS_TOPIC``, ``BENCH_NAIVE_REQUESTS_TOPIC``,
``BENCH_NAIVE_PARTITIONS``, ``BENCH_NAIVE_DATADIR``, ``BENCH_NAIVE_STATS`` (a file that receives the wall
time of the first event). Start: ``python -m bench.naive_join_app worker -l warn``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import faust

REQUIRED = ("request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token")

app = faust.App(
    os.environ.get("BENCH_NAIVE_APP_ID", "bench-naive"),
    broker=f"kafka://{os.environ.get('BENCH_NAIVE_BROKER', '127.0.0.1:9092')}",
    store="memory://",
    datadir=os.environ.get("BENCH_NAIVE_DATADIR", "/tmp/bench-naive"),
    topic_partitions=int(os.environ.get("BENCH_NAIVE_PARTITIONS", "8")),
    topic_disable_leader=True,
    consumer_auto_offset_reset="earliest",
    # The same commit cadence and group timeouts as our join, so the end of the run is observed alike.
    broker_commit_interval=0.5,
    broker_session_timeout=6.0,
    broker_heartbeat_interval=1.0,
    web_enabled=False,
)


class StageEvent(faust.Record, serializer="json"):
    """One stage event of the contract (extra fields are kept by Faust, unused here)."""

    request_id: str
    tenant_id: str
    stage: str
    ts_ms: float
    duration_ms: float | None = None
    version_id: str = "unknown"
    route: str | None = None
    fallback_level: int = 0
    event_id: str | None = None


class PendingRequest(faust.Record, serializer="json"):
    """The table value: what is known of one open request."""

    request_id: str
    tenant_id: str
    version_id: str
    route: str | None
    fallback_level: int
    started_at: float | None
    first_token_at: float | None
    stages: dict[str, float]
    event_ids: list[str]


class JoinedRequest(faust.Record, serializer="json"):
    """The output: one complete request."""

    request_id: str
    tenant_id: str
    version_id: str
    route: str | None
    fallback_level: int
    status: str
    started_at: float
    first_token_at: float
    ttft_ms: float
    retrieval_ms: float
    prompt_assemble_ms: float
    llm_ttft_ms: float
    other_ms: float
    stages: dict[str, float]


events_topic = app.topic(os.environ.get("BENCH_NAIVE_EVENTS_TOPIC", "bench.stage-events"), value_type=StageEvent)
requests_topic = app.topic(os.environ.get("BENCH_NAIVE_REQUESTS_TOPIC", "bench.requests"), value_type=JoinedRequest)
pending = app.Table("naive-pending", default=None, value_type=PendingRequest)


def _fold(state: PendingRequest, event: StageEvent) -> None:
    if event.stage == "request_start":
        state.started_at = event.ts_ms if state.started_at is None else min(state.started_at, event.ts_ms)
        state.tenant_id, state.version_id, state.route = event.tenant_id, event.version_id, event.route
    elif event.stage == "first_token":
        first = state.first_token_at
        state.first_token_at = event.ts_ms if first is None else min(first, event.ts_ms)
    else:
        state.stages[event.stage] = state.stages.get(event.stage, 0.0) + (event.duration_ms or 0.0)
    state.fallback_level = max(state.fallback_level, event.fallback_level)


def _complete(state: PendingRequest) -> bool:
    return (
        state.started_at is not None
        and state.first_token_at is not None
        and all(s in state.stages for s in REQUIRED[1:4])
    )


def _record(state: PendingRequest) -> JoinedRequest:
    assert state.started_at is not None and state.first_token_at is not None
    ttft = state.first_token_at - state.started_at
    parts = {s: state.stages[s] for s in REQUIRED[1:4]}
    return JoinedRequest(
        request_id=state.request_id,
        tenant_id=state.tenant_id,
        version_id=state.version_id,
        route=state.route,
        fallback_level=state.fallback_level,
        status="complete",
        started_at=state.started_at,
        first_token_at=state.first_token_at,
        ttft_ms=ttft,
        retrieval_ms=parts["retrieval"],
        prompt_assemble_ms=parts["prompt_assemble"],
        llm_ttft_ms=parts["llm_ttft"],
        other_ms=ttft - sum(parts.values()),
        stages=dict(state.stages),
    )


def _mark_first_event() -> None:
    path = os.environ.get("BENCH_NAIVE_STATS")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"first_event_at": time.time()}, fh)


@app.agent(events_topic)
async def join(stream: Any) -> None:
    """One table read and one table write per event; emit and delete when the request is complete."""
    first = True
    async for event in stream:
        if first:
            _mark_first_event()
            first = False
        state = pending.get(event.request_id)
        if state is None:
            state = PendingRequest(
                request_id=event.request_id,
                tenant_id=event.tenant_id,
                version_id=event.version_id,
                route=event.route,
                fallback_level=0,
                started_at=None,
                first_token_at=None,
                stages={},
                event_ids=[],
            )
        eid = event.event_id or f"{event.stage}/{event.ts_ms}/{event.duration_ms}"
        if eid in state.event_ids:
            continue  # a duplicate: counted once, nothing to write
        state.event_ids.append(eid)
        _fold(state, event)
        if _complete(state):
            await requests_topic.send(key=event.request_id, value=_record(state))
            pending.pop(event.request_id, None)
        else:
            pending[event.request_id] = state


if __name__ == "__main__":
    app.main()
