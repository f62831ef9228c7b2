"""The demo's story in event time: which scenarios, when, how fast, and how hard it is compressed (pure).

The story is historical traffic ending a little before now: ``seed-story`` (four phases: the "before"
world, then parallel recall, a stable prompt prefix, routing + speculative decoding) followed by
``canary-regression`` (the fixed world, then a bad canary ``v13`` on a quarter of the traffic). Its event
time is 26 minutes (:data:`FULL_LAYOUT`), or 17 for demos shorter than two minutes; the duration sets how
fast event time runs (``speedup``) and the request rates, so a shorter demo tells the same story with
fewer requests.

Why these numbers:

- Phases are whole windows (W = 60 s; so is the canary part's first 20 %) starting on a window
  boundary, so a phase is exactly a set of windows and the breakdown of a phase reads only that
  phase's requests.
- Event time never runs ahead of the wall clock: the story ends :data:`END_MARGIN_MS` (rounded down
  to a window boundary) before the moment the producer is due to finish. Once the producer stops, the
  writer's idle watermark (wall clock minus the join timeout and grace) passes every window at once, so
  the last windows close within seconds instead of a window + grace later; and the tenants have been
  silent for less than ``rules.tenant_silence.silent_windows`` when the pipeline has drained (unless
  draining takes minutes), so ``TTFTTenantSilent`` does not fire just because the story ended.
- Three tenants (:data:`DEMO_TENANTS`: two ASCII, one not; the last one runs the lagging version):
  ``TTFTCanaryFailed`` needs 1,000 samples per arm (``rules.canary``; its span grows with the canary's
  lifetime, and the story's canary part is 5 windows long); the canary arm is
  25 % of the traffic and the largest of three tenants takes ~50 %, so 30 req/s in the canary part give
  ~1,130. ``TTFTDraftAcceptanceLow`` needs 50 canary samples per window, ~7 req/s. The default duration
  affords the former; a 60 s demo only the latter.
- The whole pipeline (producer, broker, join, writer) costs about 1.5 ms of CPU per stage event here,
  so a 2-core machine keeps up with roughly 1,100 events/s: the default story is ~200 k events in
  180 s, the 60 s one ~60 k.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import orjson

from streams.sim import generate, phases
from streams.sim.traffic import Message

WINDOW_MS: Final = 60_000
DEMO_TENANTS: Final = ("acme", "globex", "bücher-ü")
#: ``ttft demo --otel``: this tenant's requests go through the OpenTelemetry Collector as traces
#: (:mod:`streams.demo.otel_traffic`), the others through the emitter. It comes before the last tenant, which
#: keeps the lagging version.
OTEL_TENANT: Final = "otel-demo"
OTEL_DEMO_TENANTS: Final = ("acme", "globex", OTEL_TENANT, "bücher-ü")
#: Event-time length (minutes) of each seed-story phase and of the whole canary-regression part: the
#: full story, and the short one for demos under :data:`SHORT_BELOW_S` (a 60 s smoke test).
FULL_LAYOUT: Final = (4, 10)
SHORT_LAYOUT: Final = (3, 5)
SHORT_BELOW_S: Final = 120.0
END_MARGIN_MS: Final = 90_000
#: Request rates (per second of event time) at the reference duration; scaled linearly with the duration.
REFERENCE_DURATION_S: Final = 180.0
SEED_RATE_RPS: Final = 8.0
CANARY_RATE_RPS: Final = 30.0
#: Floors: enough "before" requests for a stable P95 (~1,000), and enough canary samples per window for
#: the draft-acceptance rule (~75 for the largest tenant).
MIN_SEED_RATE_RPS: Final = 6.0
MIN_CANARY_RATE_RPS: Final = 10.0
MAX_SCALE: Final = 1.5
#: Stage events per request of the simulator (for the event estimate only).
EVENTS_PER_REQUEST: Final = 8.0


@dataclass(frozen=True, slots=True)
class StoryPart:
    """One scenario of the story: ``duration_s`` of event time from ``start_ms`` at ``rate_rps``."""

    scenario: str
    start_ms: int
    duration_s: int
    rate_rps: float

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_s * 1000

    @property
    def expected_requests(self) -> int:
        return round(self.duration_s * self.rate_rps)


@dataclass(frozen=True, slots=True)
class StoryPhase:
    """A named stretch of the story, ``[start_ms, end_ms)``; ``label`` is ``scenario/phase``."""

    scenario: str
    name: str
    start_ms: int
    end_ms: int

    @property
    def label(self) -> str:
        return f"{self.scenario}/{self.name}"


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """What the demo produces and how fast: event time runs ``speedup`` times faster than the wall clock."""

    parts: tuple[StoryPart, ...]
    speedup: float
    seed: int
    tenants: tuple[str, ...]
    duration_s: float

    @property
    def start_ms(self) -> int:
        return self.parts[0].start_ms

    @property
    def end_ms(self) -> int:
        return self.parts[-1].end_ms

    @property
    def expected_requests(self) -> int:
        return sum(p.expected_requests for p in self.parts)

    @property
    def expected_events(self) -> int:
        return round(self.expected_requests * EVENTS_PER_REQUEST)

    def part(self, scenario: str) -> StoryPart:
        """The part playing ``scenario``; ``KeyError`` if the story has none."""
        for p in self.parts:
            if p.scenario == scenario:
                return p
        raise KeyError(scenario)

    def phases(self) -> list[StoryPhase]:
        """Every phase of every part, in event-time order (boundaries from :func:`streams.sim.phases`)."""
        out = []
        for p in self.parts:
            for name, start, end in phases(p.scenario, p.start_ms, p.duration_s):
                out.append(StoryPhase(p.scenario, name, round(start), round(end)))
        return out

    def phase(self, scenario: str, name: str) -> StoryPhase:
        """One phase by scenario and name; ``KeyError`` if absent."""
        for ph in self.phases():
            if ph.scenario == scenario and ph.name == name:
                return ph
        raise KeyError(f"{scenario}/{name}")

    def phase_at(self, ts_ms: float) -> StoryPhase | None:
        """The phase containing event time ``ts_ms`` (None outside the story)."""
        for ph in self.phases():
            if ph.start_ms <= ts_ms < ph.end_ms:
                return ph
        return None

    def messages(self, *, without: str | None = None) -> Iterator[Message]:
        """The story's stage events, part after part (each in emission order; deterministic for the seed).

        The parts are merged by emission time: a part's last requests complete a few seconds into the next
        part, and a partition's events stay in event-time order as a live service would send them.
        ``without``: leave that tenant's events out (``--otel`` sends them as traces instead).
        """
        merged = self._merged()
        if without is None:
            return merged
        return (m for m in merged if orjson.loads(m[1]).get("tenant_id") != without)

    def _merged(self) -> Iterator[Message]:
        return heapq.merge(
            *(
                generate(
                    p.scenario,
                    rate_rps=p.rate_rps,
                    duration_s=p.duration_s,
                    tenants=self.tenants,
                    seed=self.seed + index,
                    start_ms=p.start_ms,
                )
                for index, p in enumerate(self.parts)
            ),
            key=lambda message: message[2],
        )


def plan_demo(duration_s: float, now_ms: float, *, seed: int = 7, tenants: tuple[str, ...] = DEMO_TENANTS) -> DemoPlan:
    """The story for a demo whose traffic starts producing at ``now_ms`` and takes about ``duration_s``.

    Raises ``ValueError`` for a duration below 10 s (nothing meaningful fits).
    """
    if duration_s < 10:
        raise ValueError("the demo needs at least 10 s of traffic")
    scale = min(duration_s / REFERENCE_DURATION_S, MAX_SCALE)
    seed_phase_min, canary_min = SHORT_LAYOUT if duration_s < SHORT_BELOW_S else FULL_LAYOUT
    end_ms = int((now_ms + duration_s * 1000.0 - END_MARGIN_MS) // WINDOW_MS * WINDOW_MS)
    canary_start = end_ms - canary_min * WINDOW_MS
    seed_start = canary_start - 4 * seed_phase_min * WINDOW_MS
    seed_rate = max(MIN_SEED_RATE_RPS, SEED_RATE_RPS * scale)
    canary_rate = max(MIN_CANARY_RATE_RPS, CANARY_RATE_RPS * scale)
    parts = (
        StoryPart("seed-story", seed_start, 4 * seed_phase_min * 60, seed_rate),
        StoryPart("canary-regression", canary_start, canary_min * 60, canary_rate),
    )
    # The Pacer starts the clock at the first message, at the story's start.
    span_s = (end_ms - seed_start) / 1000.0
    return DemoPlan(parts=parts, speedup=span_s / duration_s, seed=seed, tenants=tenants, duration_s=duration_s)
