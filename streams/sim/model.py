"""Per-request latency model: one request becomes the stage events a real RAG service would emit.

Every request draws one shared slowness factor ``S = exp(shared_sigma * Z0)`` (a busy host, a cold
cache, a long question) and every stage latency is ``base * exp(sigma_i * Z_i) * S`` with independent
standard normals ``Z0, Z_i``. Stage latencies are therefore positively correlated. For two stages with
their own sigmas ``s_i``, ``s_j`` and shared sigma ``s`` the correlation of their logarithms is::

    corr(log X_i, log X_j) = s^2 / sqrt((s^2 + s_i^2) * (s^2 + s_j^2))

and of the latencies themselves (Pearson, lognormal)::

    corr(X_i, X_j) = (e^{s^2} - 1) / sqrt((e^{s^2 + s_i^2} - 1) * (e^{s^2 + s_j^2} - 1))

With the defaults below (s = 0.30, s_i = s_j = 0.30) both are about 0.5 for the LLM and assembly stages;
:func:`stage_log_correlation` computes the first. Mixtures on top of that (prompt-cache hits lower both
assembly and LLM, fallbacks add a second LLM attempt) only add to it.

The timeline of one request (all offsets are non-negative, so ``other_ms`` >= 0)::

    request_start ─gap─ retrieval[ vector_recall ‖ bm25_recall (or serial) ─ rerank ] ─gap─
        prompt_assemble ─gap─ llm_ttft (one span per attempt) ─gap─ first_token

``ttft_ms = first_token - request_start`` therefore contains every span, and ``other_ms`` is the sum
of the small gaps. Times are rounded to microseconds (3 decimals) and every gap is at least 0.1 ms, so
rounding can never make ``other_ms`` negative.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

RecallMode = Literal["parallel", "serial"]

#: Below this draft acceptance rate speculative decoding costs more than it saves (DESIGN.md).
SPECULATIVE_BREAK_EVEN = 0.6
#: Prompts shorter than this never hit the provider's prefix cache (matches windows.cacheable_min_tokens).
CACHEABLE_MIN_TOKENS = 1_024
#: Prompts at least this long hit at the profile's full rate.
CACHE_FULL_TOKENS = 4_096
_MIN_GAP_MS = 0.1


@dataclass(frozen=True, slots=True)
class RequestProfile:
    """Everything that shapes one request's latencies and labels. Frozen; scenarios derive variants.

    Latency fields named ``*_ms`` are medians before the shared factor. ``fallback_rates`` are the
    probabilities of fallback level 1 (the first LLM attempt fails, a backup model answers: two
    ``llm_ttft`` spans with distinct event ids, which the join sums) and level 2 (the same, and the
    reranker is skipped).
    """

    tenant_id: str = "acme"
    version_id: str = "v12"
    rollout: Literal["stable", "canary"] | None = None
    shared_sigma: float = 0.30
    # retrieval
    recall_mode: RecallMode = "serial"
    vector_recall_ms: float = 150.0
    bm25_recall_ms: float = 110.0
    recall_sigma: float = 0.30
    rerank_base_ms: float = 30.0
    rerank_per_doc_ms: float = 3.0
    rerank_top_k: int = 50
    rerank_sigma: float = 0.25
    retrieval_cache_hit_rate: float = 0.03
    retrieval_cache_ms: float = 12.0
    retrieval_slowdown: float = 1.0
    # prompt
    prompt_tokens_median: float = 2_400.0
    prompt_tokens_sigma: float = 0.55
    stable_prefix: bool = False
    prompt_cache_max_rate: float = 0.08
    assemble_base_ms: float = 60.0
    assemble_per_1k_tokens_ms: float = 50.0
    assemble_sigma: float = 0.30
    assemble_cache_factor: float = 0.55
    # llm
    llm_base_ms: float = 350.0
    llm_per_1k_uncached_ms: float = 240.0
    llm_sigma: float = 0.30
    llm_factor: float = 1.0
    fast_route_share: float = 0.0
    fast_route_factor: float = 0.45
    speculative: bool = False
    draft_accept_mean: float = 0.78
    draft_accept_concentration: float = 60.0
    fallback_rates: tuple[float, float] = (0.02, 0.005)
    # gaps between spans (exponential means, plus the minimum gap)
    start_gap_ms: float = 2.0
    stage_gap_ms: float = 0.6
    first_token_gap_ms: float = 6.0


def stage_log_correlation(shared_sigma: float, sigma_i: float, sigma_j: float) -> float:
    """Correlation of ``log`` latencies of two stages that share the per-request slowness factor."""
    s2 = shared_sigma * shared_sigma
    return s2 / math.sqrt((s2 + sigma_i * sigma_i) * (s2 + sigma_j * sigma_j))


def speculative_multiplier(accept_rate: float) -> float:
    """LLM first-token time multiplier of speculative decoding: < 1 above the break-even, > 1 below."""
    return max(0.55, 1.0 - 0.9 * (accept_rate - SPECULATIVE_BREAK_EVEN))


def prompt_cache_hit_probability(profile: RequestProfile, prompt_tokens: int) -> float:
    """Long prompts hit the prefix cache more: 0 below the cacheable minimum, rising to the max rate."""
    if prompt_tokens < CACHEABLE_MIN_TOKENS:
        return 0.0
    ramp = min(1.0, (prompt_tokens - CACHEABLE_MIN_TOKENS) / (CACHE_FULL_TOKENS - CACHEABLE_MIN_TOKENS))
    return profile.prompt_cache_max_rate * (0.35 + 0.65 * ramp)


def _r(x: float) -> float:
    return round(x, 3)


class _Emitter:
    """Builds the event dicts of one request with the labels it shares."""

    __slots__ = ("base", "events", "request_id")

    def __init__(self, profile: RequestProfile, request_id: str, route: str, fallback_level: int) -> None:
        self.request_id = request_id
        self.base: dict[str, Any] = {"request_id": request_id, "tenant_id": profile.tenant_id}
        self.events: list[dict[str, Any]] = []
        self._labels(profile, route, fallback_level)

    def _labels(self, profile: RequestProfile, route: str, fallback_level: int) -> None:
        self.labels: dict[str, Any] = {"version_id": profile.version_id}
        if profile.rollout is not None:
            self.labels["rollout"] = profile.rollout
        self.labels["route"] = route
        self.labels["fallback_level"] = fallback_level

    def add(self, stage: str, ts: float, duration: float | None, attrs: dict[str, Any] | None,
            attempt: int = 1) -> None:
        event = {**self.base, "stage": stage, "ts_ms": _r(ts)}
        if duration is not None:
            event["duration_ms"] = duration
        event.update(self.labels)
        event["event_id"] = f"{self.request_id}/{stage}/{attempt}"
        if attrs:
            event["attrs"] = attrs
        self.events.append(event)


_Emitter.__slots__  # keep mypy/ruff quiet about the dynamic 'labels' attribute below
_Emitter.labels: dict[str, Any]  # type: ignore[misc]
