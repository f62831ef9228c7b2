"""Named traffic scenarios: phases in event time, and which request profile serves which request.

A scenario is a list of :class:`Phase` covering the run as fractions of its duration. Within a phase
every tenant has a base profile; a gray release sends ``canary_share`` of the traffic to a canary
profile (``rollout="canary"``, the rest ``rollout="stable"``). Outside gray releases ``rollout`` is
absent.

- ``seed-story``: four equal phases. ``before`` (serial recall, rerank top-k 50, no stable prompt
  prefix, one model), then the three fixes in turn, each kept by the next phase:
  ``parallel-recall`` (parallel recall, rerank top-k 20), ``stable-prefix`` (prompt-cache hits),
  ``routing-speculative`` (a fast route for ~58 % of requests plus speculative decoding).
  :data:`SEED_STORY_TARGETS` holds the stage P95s each phase is calibrated to (a unit test checks
  them within 10 % on >= 20k requests).
- ``canary-regression``: the fixed world; after the first 20 % of the run a canary version
  (``v13``) takes 25 % of every tenant's traffic with draft acceptance ~0.5 and llm_ttft ~+35 %.
- ``incident``: the fixed world; the first tenant's retrieval is 1.8x slower in the middle third
  (phases ``before``, ``incident``, ``after``).
- ``steady``: the fixed world, noise only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from streams.sim.model import RequestProfile, speculative_multiplier

SCENARIOS: Final = ("seed-story", "canary-regression", "incident", "steady")
DEFAULT_TENANTS: Final = ("acme", "globex", "bücher-ü", "知识库")
STABLE_VERSION: Final = "v12"
LAGGING_VERSION: Final = "v11"
CANARY_VERSION: Final = "v13"
CANARY_SHARE: Final = 0.25
CANARY_LLM_RATIO: Final = 1.35
INCIDENT_SLOWDOWN: Final = 1.8

#: The "before" world and the three fixes of the seed's story, each keeping the previous ones.
BEFORE: Final = RequestProfile()
PARALLEL_RECALL: Final = replace(BEFORE, recall_mode="parallel", rerank_top_k=20)
STABLE_PREFIX: Final = replace(PARALLEL_RECALL, stable_prefix=True, prompt_cache_max_rate=0.97)
ROUTING_SPECULATIVE: Final = replace(STABLE_PREFIX, fast_route_share=0.58, speculative=True)

#: The canary's draft acceptance collapses and its LLM stage is CANARY_LLM_RATIO times slower in total.
BAD_CANARY: Final = replace(
    ROUTING_SPECULATIVE,
    draft_accept_mean=0.5,
    llm_factor=CANARY_LLM_RATIO
    * speculative_multiplier(ROUTING_SPECULATIVE.draft_accept_mean)
    / speculative_multiplier(0.5),
)

#: Calibrated stage P95s (ms) per seed-story phase; ``ttft`` only where the story states it.
SEED_STORY_TARGETS: Final[dict[str, dict[str, float]]] = {
    "before": {"retrieval": 900.0, "prompt_assemble": 400.0, "llm_ttft": 1800.0, "ttft": 3200.0},
    "parallel-recall": {"retrieval": 480.0, "prompt_assemble": 400.0, "llm_ttft": 1800.0},
    "stable-prefix": {"retrieval": 480.0, "prompt_assemble": 280.0},
    "routing-speculative": {"retrieval": 480.0, "prompt_assemble": 280.0, "llm_ttft": 1000.0},
}


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of a scenario, ``[start, end)`` as fractions of the run's duration."""

    name: str
    start: float
    end: float
    base: RequestProfile
    canary: RequestProfile | None = None
    canary_share: float = 0.0
    #: Retrieval multiplier for the scenario's incident tenant (the first tenant) in this phase.
    incident_slowdown: float = 1.0


_PHASES: Final[dict[str, tuple[Phase, ...]]] = {
    "seed-story": (
        Phase("before", 0.0, 0.25, BEFORE),
        Phase("parallel-recall", 0.25, 0.5, PARALLEL_RECALL),
        Phase("stable-prefix", 0.5, 0.75, STABLE_PREFIX),
        Phase("routing-speculative", 0.75, 1.0, ROUTING_SPECULATIVE),
    ),
    "canary-regression": (
        Phase("stable", 0.0, 0.2, ROUTING_SPECULATIVE),
        Phase("canary", 0.2, 1.0, ROUTING_SPECULATIVE, canary=BAD_CANARY, canary_share=CANARY_SHARE),
    ),
    "incident": (
        Phase("before", 0.0, 0.35, ROUTING_SPECULATIVE),
        Phase("incident", 0.35, 0.7, ROUTING_SPECULATIVE, incident_slowdown=INCIDENT_SLOWDOWN),
        Phase("after", 0.7, 1.0, ROUTING_SPECULATIVE),
    ),
    "steady": (Phase("steady", 0.0, 1.0, ROUTING_SPECULATIVE),),
}


def scenario_phases(scenario: str) -> tuple[Phase, ...]:
    """The phases of a scenario; raises ``ValueError`` naming the known scenarios."""
    try:
        return _PHASES[scenario]
    except KeyError:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}") from None


def phases(scenario: str, start_ms: float, duration_s: float) -> list[tuple[str, float, float]]:
    """Phase boundaries in event time: ``[(name, start_ms, end_ms)]``, contiguous, covering the run.

    A request belongs to the phase containing its ``request_start``.
    """
    span = duration_s * 1000.0
    return [(p.name, start_ms + p.start * span, start_ms + p.end * span) for p in scenario_phases(scenario)]


def incident_tenant(tenants: Sequence[str]) -> str:
    """The tenant whose retrieval slows down in the ``incident`` scenario: the first one."""
    return tenants[0]


def tenant_weights(count: int) -> list[float]:
    """Traffic share per tenant, in list order: a gentle power law, normalised to 1."""
    raw = [1.0 / (i + 1) ** 0.8 for i in range(count)]
    total = sum(raw)
    return [w / total for w in raw]


def tenant_version(tenants: Sequence[str], index: int) -> str:
    """Every tenant runs the stable version except the last of three or more, which lags behind."""
    return LAGGING_VERSION if len(tenants) >= 3 and index == len(tenants) - 1 else STABLE_VERSION


class ProfileBook:
    """Resolves (phase, tenant, arm) to a profile with the right labels; built once per run."""

    def __init__(self, scenario: str, tenants: Sequence[str]) -> None:
        if not tenants:
            raise ValueError("at least one tenant is required")
        if len(set(tenants)) != len(tenants):
            raise ValueError("tenants must be distinct")
        self.phases = scenario_phases(scenario)
        self.tenants = tuple(tenants)
        self._book: dict[tuple[int, int, bool], RequestProfile] = {}
        for p_index, phase in enumerate(self.phases):
            for t_index, tenant in enumerate(self.tenants):
                self._book[(p_index, t_index, False)] = self._label(phase, phase.base, tenant, t_index, False)
                if phase.canary is not None:
                    self._book[(p_index, t_index, True)] = self._label(phase, phase.canary, tenant, t_index, True)

    def _label(self, phase: Phase, profile: RequestProfile, tenant: str, t_index: int, canary: bool) -> RequestProfile:
        gray = phase.canary is not None
        version = CANARY_VERSION if canary else tenant_version(self.tenants, t_index)
        slowdown = phase.incident_slowdown if t_index == 0 else 1.0
        return replace(
            profile,
            tenant_id=tenant,
            version_id=version,
            rollout=("canary" if canary else "stable") if gray else None,
            retrieval_slowdown=profile.retrieval_slowdown * slowdown,
        )

    def phase_index(self, fraction: float) -> int:
        """Index of the phase containing ``fraction`` of the run (clamped to the last phase)."""
        for index, phase in enumerate(self.phases):
            if fraction < phase.end:
                return index
        return len(self.phases) - 1

    def profile(self, phase_index: int, tenant_index: int, canary_draw: float) -> RequestProfile:
        """The profile for one request; ``canary_draw`` is a uniform [0, 1) draw picking the arm."""
        phase = self.phases[phase_index]
        canary = phase.canary is not None and canary_draw < phase.canary_share
        return self._book[(phase_index, tenant_index, canary)]
