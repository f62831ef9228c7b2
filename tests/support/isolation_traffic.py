"""The inputs of the tenant-isolation test (tests/integration/test_tenant_isolation.py, issues 14 and 27),
shared with the benchmark that folds them offline (bench/isolation.py).

- ``good``: three well-behaved tenants' seeded traffic over 13 one-minute windows (one of them regresses,
  so an alert fires), the last ``LIVE_TAIL_S`` seconds of it due after "now";
- ``issue14``: the same with issue 14's hostile tenant interleaved, in every window doing all of that
  issue's items 2, 3, 4, 5, 7 and 8 at once (>= 50,000 events);
- ``attacks``: issue 27's (tests/support/hostile_mix.py): OTLP spans with NaN, Infinity and 2^64 times and a
  trace holding 300 spans of 4 KB attributes, 20,000 sprayed tenant ids, 2,000 unparseable messages on one
  partition, and a tenant whose events are 14 minutes old when they arrive.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from tests.support import hostile_mix
from tests.support.hostile_mix import Placed
from tests.support.scenarios import RegressionTraffic, regression_traffic

GOOD = {"acme": 6.0, "globex": 2.0, "initech": 1.0}
HOSTILE = "mallory"
CONFIG: dict[str, Any] = {
    "rules": {"stale_windows": 2_000, "tenant_silence": {"enabled": False}},
    # The idle tick moves a caught-up tenant's clock on by wall time after this much silence. The good traffic's
    # live tail comes from one producer thread in the test's process; on a loaded host it stalled for over a second
    # (CI, 2026-12-07), and the alone run, caught up and idle, emitted seven requests before their last events
    # (late_events 1-2) while the mixed run, still busy, did not: rows that differ for a reason outside the join.
    "join": {"max_open_requests_per_tenant": 1_000, "idle_tick_ms": 5_000},
}
REGISTERED = [*GOOD, HOSTILE, hostile_mix.LAGGARD]
#: The good traffic's last seconds are played live (sent when the clock reaches them), the rest is a backlog.
LIVE_TAIL_S = 150.0
GRACE_S = 10
WINDOWS = 13
Msg = tuple[bytes, bytes]


def config_27(prefix: str) -> dict[str, Any]:
    """The pipelines' configuration (``TTFT_CONFIG``) of the isolation runs, ``prefix`` their topic prefix."""
    return {
        **CONFIG,
        "windows": {"grace_s": GRACE_S},
        "tenancy": {"registered": REGISTERED},
        "otlp": {"topic": f"{prefix}-otlp_spans"},
    }


@dataclass(frozen=True)
class IsolationInputs:
    """Each run's messages, placed (send time, topic role); see the module docstring."""

    start_ms: int
    good: list[Placed]
    issue14: list[Placed]
    attacks: list[Placed]
    #: Events of issue 14's hostile tenant in ``issue14``.
    hostile_sent: int

    @property
    def mixed(self) -> list[Placed]:
        return self.issue14 + self.attacks

    def hostile(self) -> list[Placed]:
        """Everything ``mixed`` has that ``good`` has not: the hostile input alone."""
        good = {(m.key, m.value) for m in self.good}
        return [m for m in self.issue14 if (m.key, m.value) not in good] + self.attacks


def isolation_inputs(now_ms: float) -> IsolationInputs:
    """The runs' inputs for a clock at ``now_ms``: 13 windows, the last ``LIVE_TAIL_S`` of them live."""
    start_ms = int(now_ms - WINDOWS * 60_000 + LIVE_TAIL_S * 1000)
    traffic = regression_traffic(
        start_ms,
        tenants=GOOD,
        incident_tenant="acme",
        slowdown=1.5,
        windows_before=5,
        windows_incident=5,
        windows_after=3,
        seed=14,
    )
    good = [
        m
        for i, chunk in enumerate(traffic.chunks)
        for m in hostile_mix.placed(chunk, start_ms + (i + 1) * 60_000 + 5_000)
    ]
    chunks, hostile_sent = mixed_chunks(traffic, seed=41)
    issue14 = [
        m for i, chunk in enumerate(chunks) for m in hostile_mix.placed(chunk, start_ms + (i + 1) * 60_000 + 5_000)
    ]
    window_starts = [start_ms + i * 60_000 for i in range(WINDOWS - 2)]
    attacks = (
        hostile_mix.otlp_attacks(window_starts[1:4])
        + hostile_mix.sprayed_tenants(window_starts)
        + hostile_mix.unparseable(window_starts[3])
        + hostile_mix.laggard(start_ms, start_ms + WINDOWS * 60_000)
    )
    return IsolationInputs(start_ms, good, issue14, attacks, hostile_sent)


def _event(rid: str, stage: str, ts: float, **extra: Any) -> dict[str, Any]:
    return {"request_id": rid, "tenant_id": HOSTILE, "version_id": "h1", "stage": stage, "ts_ms": ts, **extra}


def _request(rid: str, t: float, version: str, route: str, custom: str) -> list[dict[str, Any]]:
    """A complete request of the hostile tenant, with its own version, route and custom stage (item 5)."""
    base = {"version_id": version, "route": route}
    return [
        _event(rid, "request_start", t, **base),
        _event(rid, "retrieval", t + 5, duration_ms=90.0, **base),
        _event(rid, custom, t + 96, duration_ms=3.0, **base),
        _event(rid, "prompt_assemble", t + 100, duration_ms=30.0, **base),
        _event(rid, "llm_ttft", t + 131, duration_ms=400.0, **base),
        _event(rid, "first_token", t + 532, **base),
    ]


def hostile_window(
    index: int, last: int, start: float, good_ids: list[str], rng: random.Random
) -> list[tuple[float, Msg]]:
    """The hostile tenant's events of one window, each with the event time it is produced at."""
    events: list[dict[str, Any]] = []
    raw: list[tuple[float, Msg]] = []
    for k, rid in enumerate(good_ids[:60]):  # 4: the good tenants' request ids; 5: a version per request
        events += _request(rid, start + 500 + k * 400, f"v{index}-{k}", f"route-{index}-{k}", f"hx_{index}_{k}")
    for k in range(1_600):  # 5: open requests past the per-tenant cap (evicted: the tenant's own)
        events.append(_event(f"open-{index}-{k}", "request_start", start + k * 30.0))
    for k in range(10):  # 8: conflicting duplicates (same event id, another duration) and duplicate keys
        t = start + 20_000 + k * 100
        first = _event(f"conflict-{index}-{k}", "retrieval", t, duration_ms=50.0, event_id=f"e{index}-{k}")
        events += [first, {**first, "duration_ms": 70.0}]
        dup = orjson.dumps(_event(f"dupkey-{index}-{k}", "request_start", t))[:-1] + b',"version_id":"h2"}'
        raw.append((t, (f"dupkey-{index}-{k}".encode(), dup)))
    for k in range(5):  # 2: 24 h ahead of the clock (dead-lettered)
        events.append(_event(f"skew-{index}-{k}", "retrieval", start + 86_400_000, duration_ms=5.0))
    if index == last:  # 2: 12 min ahead of its own watermark, which one event moves by 10 min at most
        for k in range(40):
            events.append(_event(f"ahead-{index}-{k}", "retrieval", start + 40_000 + 720_000, duration_ms=5.0))
    if index == 2:  # 3: a constant request id, 20,000 events
        for k in range(20_000):
            stage = ("request_start", "retrieval", "llm_ttft", "first_token")[k % 4]
            extra = {"duration_ms": 2.0} if stage in ("retrieval", "llm_ttft") else {}
            events.append(_event("unknown", stage, start + 1_000 + k * 2.0, **extra))
    if index == 4:  # 7: a bad deploy, every event invalid (negative duration), 8,000 in 20 s
        for k in range(8_000):
            events.append(_event(f"bad-{index}-{k}", "retrieval", start + 1_000 + k * 2.5, duration_ms=-1.0))
    rng.shuffle(events)  # arrival order within a window is not event-time order
    out = [(e["ts_ms"], (e["request_id"].encode(), orjson.dumps(e))) for e in events]
    return out + raw


def mixed_chunks(traffic: RegressionTraffic, seed: int) -> tuple[list[list[Msg]], int]:
    """The good chunks with the hostile events interleaved (by event time within each window)."""
    rng = random.Random(seed)
    chunks: list[list[Msg]] = []
    total = 0
    for index, chunk in enumerate(traffic.chunks):
        start = traffic.start_ms + index * traffic.window_ms
        good = [(orjson.loads(v)["ts_ms"], (k, v)) for k, v in chunk]
        good_ids = list(dict.fromkeys(k.decode() for _, (k, _) in good))
        hostile = hostile_window(index, len(traffic.chunks) - 1, start, good_ids, rng)
        total += len(hostile)
        merged = sorted(
            [(t, 0, i, m) for i, (t, m) in enumerate(good)] + [(t, 1, i, m) for i, (t, m) in enumerate(hostile)]
        )
        chunks.append([m for *_, m in merged])
    return chunks, total
