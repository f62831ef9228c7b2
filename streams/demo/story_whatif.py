"""The demo's story told by ``ttft whatif``: what to cut first, and each fix predicted before it landed (pure).

Stage P95s do not add up to TTFT's P95, so the verdict ranks the stages by replaying the ``before`` phase's
requests with each one 20 % faster (:func:`streams.core.whatif_rank.rank_stages`) instead of reading the
largest stage P95. Then each fix of the seed story is predicted on the phase before it, with the levers
that describe it, and set beside the TTFT P95 the phase after it observed: the check a team would make
once its fix shipped.

The levers follow from the simulator's profiles (:mod:`streams.sim.scenarios`), the way a team would
derive them from what its fix changes:

- ``parallel-recall``: the two recall legs run side by side (``--parallel-recall``), and rerank's top-k
  goes from 50 to 20: rerank costs ``30 + 3.38 k`` ms, so ``--scale rerank=0.49``;
- ``stable-prefix``: most cacheable prompts now hit the provider's prefix cache (the profile's expected
  share, ``--cache-hits 0.84``), a hit caches 75 % of its prompt instead of 40 % (``--cached-share 0.75``),
  and a cached prompt assembles in 0.64 of the time (``--scale prompt_assemble=0.64``);
- ``routing-speculative``: 58 % of the requests go to a fast route whose first token takes 0.4 of the
  time, a route with no traffic before (``--route-share fast=0.58:0.4``), and speculative decoding at
  ~78 % draft acceptance takes the first token to 0.84 of its time (``--scale llm_ttft=0.84``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from streams.core.whatif import RequestColumns, WhatIf, WhatIfRefused, observed_percentiles, predict
from streams.core.whatif_levers import AllCacheHits, CachedShare, Lever, ParallelRecall, RouteShare, Scale
from streams.sim.model import RequestProfile, cached_share, expected_hit_share, speculative_multiplier
from streams.sim.scenarios import BEFORE, PARALLEL_RECALL, ROUTING_SPECULATIVE, STABLE_PREFIX

#: The demo's phases are a few minutes long, so long prompts are rare: the ``4k-16k`` prompt bucket holds a
#: handful of prompt-cache hits (the product's default asks for 10 donors per bucket).
DEMO_MIN_DONORS: Final = 3
#: A prediction "holds" when the observed P95 lies in its interval or within this much of it (issue 26).
TOLERANCE: Final = 0.05


@dataclass(frozen=True, slots=True)
class StoryFix:
    """One fix of the seed story: the phase it starts, the phase before it, and the levers describing it."""

    phase: str
    before: str
    levers: tuple[Lever, ...]
    why: str

    @property
    def command(self) -> str:
        return " ".join(lever.text for lever in self.levers)


def _rerank_ms(profile: RequestProfile) -> float:
    return profile.rerank_base_ms + profile.rerank_per_doc_ms * profile.rerank_top_k


def story_fixes() -> tuple[StoryFix, ...]:
    """The seed story's three fixes, each with the levers its profile change amounts to (module docstring)."""
    rerank = round(_rerank_ms(PARALLEL_RECALL) / _rerank_ms(BEFORE), 2)
    assemble = round(STABLE_PREFIX.assemble_cache_factor, 2)
    hits = round(expected_hit_share(STABLE_PREFIX), 2)
    routed = ROUTING_SPECULATIVE
    speculative = round(speculative_multiplier(routed.draft_accept_mean), 2)
    return (
        StoryFix(
            "parallel-recall",
            "before",
            (ParallelRecall(), Scale("rerank", rerank)),
            f"recall legs in parallel; rerank top-k {BEFORE.rerank_top_k} -> {PARALLEL_RECALL.rerank_top_k}",
        ),
        StoryFix(
            "stable-prefix",
            "parallel-recall",
            (AllCacheHits(hits), CachedShare(cached_share(STABLE_PREFIX)), Scale("prompt_assemble", assemble)),
            "a stable prompt prefix: most prompts hit the prefix cache, hits cache more and assemble faster",
        ),
        StoryFix(
            "routing-speculative",
            "stable-prefix",
            (RouteShare("fast", routed.fast_route_share, routed.fast_route_factor), Scale("llm_ttft", speculative)),
            "a fast route for part of the traffic, and speculative decoding",
        ),
    )


@dataclass(frozen=True, slots=True)
class FixOutcome:
    """A fix predicted on the phase before it (``result``; ``refused`` when the replay could not answer)
    beside the TTFT P95 the phase after it observed (``observed_p95``, exact; ``None`` without requests)."""

    fix: StoryFix
    result: WhatIf | None
    observed_p95: float | None
    refused: str = ""

    @property
    def error(self) -> float | None:
        """Predicted over observed P95, less 1."""
        if self.result is None or not self.observed_p95:
            return None
        return self.result.predicted["p95"] / self.observed_p95 - 1.0

    @property
    def naive_error(self) -> float | None:
        """The naive estimate over the observed P95, less 1."""
        if self.result is None or not self.observed_p95:
            return None
        return self.result.naive_p95 / self.observed_p95 - 1.0

    @property
    def inside(self) -> bool:
        """The observed P95 lies in the prediction's 95 % interval."""
        if self.result is None or self.observed_p95 is None:
            return False
        lo, hi = self.result.p95_ci
        return lo <= self.observed_p95 <= hi

    @property
    def holds(self) -> bool:
        """Inside the interval, or within :data:`TOLERANCE` of the observed P95."""
        error = self.error
        return self.inside or (error is not None and abs(error) <= TOLERANCE)

    def line(self) -> str:
        """One line for the demo's verdict and its report."""
        fix = self.fix
        head = f"fix {fix.phase}, predicted on phase {fix.before} with {fix.command}"
        if self.result is None:
            return f"{head}: no prediction ({self.refused or 'no requests'})"
        predicted, naive = self.result.predicted["p95"], self.result.naive_p95
        lo, hi = self.result.p95_ci
        text = (
            f"{head}: TTFT P95 {predicted:,.0f} ms (95 % CI {lo:,.0f}-{hi:,.0f}) over {self.result.requests:,} requests"
        )
        if self.observed_p95 is None or self.error is None or self.naive_error is None:
            return text + "; nothing observed after it"
        where = "inside the interval" if self.inside else "outside the interval"
        return (
            f"{text}; observed after it {self.observed_p95:,.0f} ms: {self.error:+.1%}, {where}; naive estimate "
            f"{naive:,.0f} ms ({self.naive_error:+.1%})"
        )


def predict_fixes(
    phases: Mapping[str, RequestColumns], *, min_donors: int = DEMO_MIN_DONORS, seed: int = 0
) -> list[FixOutcome]:
    """Each fix of :func:`story_fixes` replayed on its phase before, beside the phase after (``phases``: the
    seed story's complete requests by phase name; a missing phase has no requests)."""
    outcomes = []
    for fix in story_fixes():
        after = phases.get(fix.phase)
        observed = observed_percentiles(after)["p95"] if after is not None and after.n else None
        before = phases.get(fix.before)
        if before is None or not before.n:
            outcomes.append(FixOutcome(fix, None, observed, f"no complete requests in phase {fix.before}"))
            continue
        try:
            result = predict(before, fix.levers, seed=seed, min_donors=min_donors)
        except WhatIfRefused as exc:
            outcomes.append(FixOutcome(fix, None, observed, str(exc)))
            continue
        outcomes.append(FixOutcome(fix, result, observed))
    return outcomes
