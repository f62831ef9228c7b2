"""Cost of the join: microseconds per add() and memory per open request (budget: 2 KiB each).

The default size keeps the unit suite fast; ``TTFT_JOIN_BUDGET_REQUESTS=100000 pytest -s`` measures at
the design's scale and prints the numbers.
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc
from collections.abc import Iterator

from schemas.events import StageEvent
from streams.core.join import RequestJoin
from streams.settings import JoinConfig

T0 = 1_700_000_000_000.0
N = int(os.environ.get("TTFT_JOIN_BUDGET_REQUESTS", "5000"))
BUDGET_BYTES = 2_048
PARTITIONS = 8
PROMPT_ATTRS: dict[str, object] = {"prompt_tokens": 3_100, "cached_tokens": 2_048, "prompt_cache_hit": True}


def typical_request(i: int) -> list[StageEvent]:
    """Eight events as a service sends them: ids, identity fields, a trace id and cache attrs."""
    rid = f"req-{i:012d}-5f0c2a9e"
    start = T0 + i * 3.0
    specs: list[tuple[str, float, float | None, dict[str, object] | None]] = [
        ("request_start", 0, None, {"trace_id": f"{i:032x}"}),
        ("retrieval", 2, 310.5, {"retrieval_cache_hit": False}),
        ("vector_recall", 3, 120.25, None),
        ("bm25_recall", 3, 95.0, None),
        ("rerank", 130, 180.0, {"rerank_top_k": 20}),
        ("prompt_assemble", 313, 84.0, PROMPT_ATTRS),
        ("llm_ttft", 398, 1_150.75, {"draft_accept_rate": 0.72}),
        ("first_token", 1_549, None, None),
    ]
    return [
        StageEvent.model_validate(
            {
                "request_id": rid,
                "tenant_id": f"tenant-{i % 50}",
                "stage": stage,
                "ts_ms": start + dt,
                "duration_ms": dur,
                "event_id": f"{rid}:{stage}",
                "version_id": "gpt-x-2024-06",
                "route": "main",
                "rollout": "stable",
                "attrs": attrs,
            }
        )
        for stage, dt, dur, attrs in specs
    ]


def fresh_join(open_requests: int = N) -> RequestJoin:
    return RequestJoin(JoinConfig(max_open_requests=max(open_requests, 20_000)), 60_000)


def stream(n: int) -> Iterator[tuple[int, list[StageEvent]]]:
    for i in range(n):
        yield i % PARTITIONS, typical_request(i)


def test_microseconds_per_add() -> None:
    requests = list(stream(min(N, 20_000)))
    join = fresh_join()
    started = time.process_time()
    for partition, events in requests:
        for event in events:
            join.add(event, partition, 0.0)
    elapsed = time.process_time() - started
    per_request_us = elapsed / len(requests) * 1e6
    print(f"\njoin.add: {per_request_us / 8:.2f} us/event, {per_request_us:.1f} us per 8-event request (CPU)")
    started = time.process_time()
    dirty = join.dirty()
    pack_us = (time.process_time() - started) / len(dirty) * 1e6
    print(f"join.dirty: {pack_us:.2f} us per request (one packed state write)")
    assert join.open_requests == len(requests)
    assert per_request_us / 8 < 200  # generous: this is a shared 2-core machine


def test_memory_per_open_request_is_within_budget() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        join = fresh_join()
        base, _ = tracemalloc.get_traced_memory()
        for partition, events in stream(N):
            for event in events:
                join.add(event, partition, 0.0)
            del events
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_request = (used - base) / N
    packed = [p for _, p in join.dirty().values() if p is not None]
    avg_packed = sum(map(len, packed)) / len(packed)
    print(f"\n{N} open requests: {per_request:.0f} B/request (tracemalloc); changelog value {avg_packed:.0f} B")
    assert join.open_requests == N
    assert per_request <= BUDGET_BYTES
    assert avg_packed <= 600
