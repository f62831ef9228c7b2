"""The events every measurement shares, built once per run by the simulator (deterministic for a seed).

Historical traffic (event time two hours back) so the join finalises requests by event time at full speed,
the same way a replay does; the lag measurement builds its own live traffic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from streams.sim import generate
from streams.sim.traffic import Message

SCENARIO = "steady"
#: Stage events per request of the ``steady`` scenario, measured (used only to size a run).
EVENTS_PER_REQUEST = 7.9
HISTORY_RATE_RPS = 1_000.0


@dataclass(frozen=True)
class Traffic:
    """Pre-built messages and what the pipeline must make of them."""

    messages: list[Message]
    request_ids: list[bytes]  # in order of first appearance
    generate_s: float

    @property
    def events(self) -> int:
        return len(self.messages)

    @property
    def requests(self) -> int:
        return len(self.request_ids)


def build_traffic(events: int, seed: int = 7, rate_rps: float = HISTORY_RATE_RPS) -> Traffic:
    """About ``events`` stage events of complete requests, starting two hours ago."""
    duration_s = max(events / EVENTS_PER_REQUEST / rate_rps, 1.0)
    start_ms = (time.time() - 2 * 3600) * 1000.0
    started = time.perf_counter()
    messages = list(generate(SCENARIO, rate_rps=rate_rps, duration_s=duration_s, seed=seed, start_ms=start_ms))
    elapsed = time.perf_counter() - started
    return Traffic(messages, _request_ids(messages), elapsed)


def _request_ids(messages: Sequence[Message]) -> list[bytes]:
    seen: dict[bytes, None] = {}
    for key, _, _ in messages:
        seen.setdefault(key, None)
    return list(seen)


def first_requests(traffic: Traffic, requests: int) -> list[Message]:
    """The events of the first ``requests`` requests, in their original order (a prefix of the traffic)."""
    keep = set(traffic.request_ids[:requests])
    return [m for m in traffic.messages if m[0] in keep]


def request_starts(template: Message, count: int, start_ms: float) -> list[Message]:
    """``count`` ``request_start`` events shaped like ``template`` (one of the simulator's), fresh ids."""
    event = orjson.loads(template[1])
    if event.get("stage") != "request_start":
        raise ValueError("template must be a request_start event")
    out: list[Message] = []
    for i in range(count):
        rid = f"open-{i:07d}"
        ts = start_ms + i * 0.5
        event.update(request_id=rid, ts_ms=ts, event_id=f"{rid}/request_start/1")
        out.append((rid.encode(), orjson.dumps(event), ts))
    return out
