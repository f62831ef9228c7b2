"""Per-request latency model: one request becomes the stage events a real RAG service would emit.

Every request draws one shared slowness factor ``S = exp(shared_sigma * Z0)`` (a busy host, a
complex question, a long context) and every stage latency is ``base * exp(sigma_i * Z_i) * S`` with
independent standard normals ``Z0, Z_i``. For two stages with own sigmas ``s_i``, ``s_j`` and shared
sigma ``s`` the correlation of their logarithms is::

    corr(log X_i, log X_j) = s^2 / sqrt((s^2 + s_i^2) * (s^2 + s_j^2))

and of the latencies themselves (Pearson, lognormal)::

    corr(X_i, X_j) = (e^{s^2} - 1) / sqrt((e^{s^2 + s_i^2} - 1) * (e^{s^2 + s_j^2} - 1))

With the defaults (s = 0.45, s_i = s_j = 0.12) the log correlation is 0.93 and the Pearson one 0.92
(:func:`stage_log_correlation`; a unit test measures it). Whole stages correlate less, because prompt
length, cache hits, routes and fallbacks add their own variance: in the calibrated "before" world the
log correlation is about 0.55 between retrieval and llm_ttft and about 0.9 between prompt_assemble
and llm_ttft (both measured by unit tests).

Why so strongly shared: the seed's numbers put the TTFT P95 (3.2 s) above the sum of its stage P95s
(0.9 + 0.4 + 1.8 s). The P95 of a sum only reaches the sum of the P95s when the stages are nearly
comonotone, i.e. slow requests are slow in every stage; weakly correlated stages would put the TTFT
P95 well below 3.1 s. The calibration therefore lands each stage about 3 % above its target
and the TTFT P95 at about 3.14 s.

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
from statistics import NormalDist
from typing import Any, Literal

RecallMode = Literal["parallel", "serial"]

#: Below this draft acceptance rate speculative decoding costs more than it saves (docs/design.md).
SPECULATIVE_BREAK_EVEN = 0.6
#: Prompts shorter than this never hit the provider's prefix cache (matches windows.cacheable_min_tokens).
CACHEABLE_MIN_TOKENS = 1_024
#: Prompts at least this long hit at the profile's full rate.
CACHE_FULL_TOKENS = 3_072
_MIN_GAP_MS = 0.1


@dataclass(frozen=True, slots=True)
class RequestProfile:
    """Everything that shapes one request's latencies and labels. Frozen; scenarios derive variants.

    The defaults are the calibrated "before" world of the ``seed-story`` scenario (serial recall,
    rerank top-k 50, no stable prompt prefix, one model, no speculative decoding). Fields named
    ``*_ms`` are medians before the shared factor. ``fallback_rates`` are the probabilities of
    fallback level 1 (the first LLM attempt is abandoned at a timeout and a backup answers: two
    ``llm_ttft`` spans with distinct event ids, which the join sums) and level 2 (the same, and the
    reranker is skipped).
    """

    tenant_id: str = "acme"
    version_id: str = "v12"
    rollout: Literal["stable", "canary"] | None = None
    shared_sigma: float = 0.45
    # retrieval
    recall_mode: RecallMode = "serial"
    vector_recall_ms: float = 136.0
    bm25_recall_ms: float = 100.0
    recall_sigma: float = 0.12
    rerank_base_ms: float = 30.0
    rerank_per_doc_ms: float = 3.38
    rerank_top_k: int = 50
    rerank_sigma: float = 0.12
    retrieval_cache_hit_rate: float = 0.03
    retrieval_cache_ms: float = 12.0
    retrieval_slowdown: float = 1.0
    # prompt
    prompt_tokens_median: float = 2_400.0
    prompt_tokens_sigma: float = 0.30
    stable_prefix: bool = False
    prompt_cache_max_rate: float = 0.08
    assemble_base_ms: float = 59.0
    assemble_per_1k_tokens_ms: float = 49.5
    assemble_sigma: float = 0.12
    assemble_cache_factor: float = 0.64
    # llm
    llm_base_ms: float = 595.0
    llm_per_1k_uncached_ms: float = 102.0
    llm_sigma: float = 0.12
    llm_factor: float = 1.0
    fast_route_share: float = 0.0
    fast_route_factor: float = 0.40
    speculative: bool = False
    draft_accept_mean: float = 0.78
    draft_accept_concentration: float = 60.0
    fallback_rates: tuple[float, float] = (0.01, 0.003)
    # gaps between spans (exponential means on top of a 0.1 ms minimum): these make other_ms
    start_gap_ms: float = 2.0
    stage_gap_ms: float = 0.6
    first_token_gap_ms: float = 6.0


def stage_log_correlation(shared_sigma: float, sigma_i: float, sigma_j: float) -> float:
    """Correlation of the ``log`` latencies of two stages that share the per-request slowness factor."""
    v = shared_sigma * shared_sigma
    return v / math.sqrt((v + sigma_i * sigma_i) * (v + sigma_j * sigma_j))


def speculative_multiplier(accept_rate: float) -> float:
    """LLM first-token time multiplier of speculative decoding: < 1 above the break-even, > 1 below."""
    return max(0.55, 1.0 - 0.9 * (accept_rate - SPECULATIVE_BREAK_EVEN))


def cached_share(profile: RequestProfile) -> float:
    """Share of a hit's prompt the provider's prefix cache holds: 0.75 with a stable prefix, else 0.4."""
    return 0.75 if profile.stable_prefix else 0.4


def expected_hit_share(profile: RequestProfile, points: int = 1_000) -> float:
    """Share of the cacheable prompts that hit, over the profile's prompt sizes (their lognormal's quantiles;
    the clamp to [120, 64,000] tokens ignored)."""
    normal = NormalDist()
    sizes = [
        profile.prompt_tokens_median * math.exp(profile.prompt_tokens_sigma * normal.inv_cdf((i + 0.5) / points))
        for i in range(points)
    ]
    cacheable = [int(t) for t in sizes if t >= CACHEABLE_MIN_TOKENS]
    return sum(prompt_cache_hit_probability(profile, t) for t in cacheable) / len(cacheable) if cacheable else 0.0


def prompt_cache_hit_probability(profile: RequestProfile, prompt_tokens: int) -> float:
    """Long prompts hit the prefix cache more: 0 below the cacheable minimum, rising to the max rate."""
    if prompt_tokens < CACHEABLE_MIN_TOKENS:
        return 0.0
    ramp = min(1.0, (prompt_tokens - CACHEABLE_MIN_TOKENS) / (CACHE_FULL_TOKENS - CACHEABLE_MIN_TOKENS))
    return profile.prompt_cache_max_rate * (0.6 + 0.4 * ramp)


def _round(x: float) -> float:
    # Microsecond resolution; int() arithmetic is ~5x cheaper than round(x, 3) and x is never negative.
    return int(x * 1000.0 + 0.5) / 1000.0


def _gap(rng: random.Random, mean_ms: float) -> float:
    return _MIN_GAP_MS + rng.expovariate(1.0 / mean_ms)


def _draft_accept_rate(rng: random.Random, profile: RequestProfile) -> float:
    c = profile.draft_accept_concentration
    return round(rng.betavariate(profile.draft_accept_mean * c, (1.0 - profile.draft_accept_mean) * c), 3)


def _llm_attempt_ms(rng: random.Random, profile: RequestProfile, uncached_tokens: int, factor: float) -> float:
    prefill = profile.llm_base_ms + profile.llm_per_1k_uncached_ms * uncached_tokens / 1000.0
    return _round(prefill * math.exp(profile.llm_sigma * rng.gauss(0.0, 1.0)) * factor)


class _Request:
    """The events of one request under construction; one method per stage group."""

    __slots__ = ("events", "labels", "profile", "request_id", "rng", "shared")

    def __init__(self, rng: random.Random, profile: RequestProfile, request_id: str) -> None:
        self.rng = rng
        self.profile = profile
        self.request_id = request_id
        self.events: list[dict[str, Any]] = []
        self.shared = math.exp(profile.shared_sigma * rng.gauss(0.0, 1.0))
        fast = profile.fast_route_share > 0 and rng.random() < profile.fast_route_share
        u = rng.random()
        level1, level2 = profile.fallback_rates
        self.labels: dict[str, Any] = {"version_id": profile.version_id}
        if profile.rollout is not None:
            self.labels["rollout"] = profile.rollout
        self.labels["route"] = "fast" if fast else "main"
        self.labels["fallback_level"] = 2 if u < level2 else 1 if u < level1 + level2 else 0

    def emit(self, stage: str, ts: float, duration: float | None, attrs: dict[str, Any], attempt: int = 1) -> None:
        # One dict literal per event: this is the simulator's hottest function.
        rid = self.request_id
        tenant = self.profile.tenant_id
        ts_ms = _round(ts)
        event: dict[str, Any]
        if duration is None:
            event = {"request_id": rid, "tenant_id": tenant, "stage": stage, "ts_ms": ts_ms, **self.labels}
        else:
            event = {
                "request_id": rid,
                "tenant_id": tenant,
                "stage": stage,
                "ts_ms": ts_ms,
                "duration_ms": duration,
            }
            event.update(self.labels)
        event["event_id"] = f"{rid}/{stage}/{attempt}"
        if attrs:
            event["attrs"] = attrs
        self.events.append(event)

    def retrieval(self, start: float) -> float:
        """Recall (parallel or serial), then rerank; a retrieval-cache hit skips both. Returns the end."""
        profile, rng, gauss = self.profile, self.rng, self.rng.gauss
        slow = self.shared * profile.retrieval_slowdown
        attrs: dict[str, Any] = {"retrieval_cache_hit": False}
        if rng.random() < profile.retrieval_cache_hit_rate:
            attrs["retrieval_cache_hit"] = True
            end = start + profile.retrieval_cache_ms * math.exp(profile.recall_sigma * gauss(0.0, 1.0)) * self.shared
        else:
            vector = _round(profile.vector_recall_ms * math.exp(profile.recall_sigma * gauss(0.0, 1.0)) * slow)
            bm25 = _round(profile.bm25_recall_ms * math.exp(profile.recall_sigma * gauss(0.0, 1.0)) * slow)
            v_start = start + 0.2
            b_start = start + 0.3 if profile.recall_mode == "parallel" else v_start + vector + _gap(rng, 0.3)
            self.emit("vector_recall", v_start, vector, {})
            self.emit("bm25_recall", b_start, bm25, {})
            end = max(v_start + vector, b_start + bm25)
            if self.labels["fallback_level"] < 2:  # level 2 degrades retrieval: no rerank
                k = profile.rerank_top_k
                rerank_ms = profile.rerank_base_ms + profile.rerank_per_doc_ms * k
                rerank = _round(rerank_ms * math.exp(profile.rerank_sigma * gauss(0.0, 1.0)) * slow)
                rerank_start = end + _gap(rng, 0.2)
                self.emit("rerank", rerank_start, rerank, {"rerank_top_k": k})
                attrs["rerank_top_k"] = k
                end = rerank_start + rerank
            end += _MIN_GAP_MS
        duration = _round(end - _round(start))
        self.emit("retrieval", start, duration, attrs)
        return _round(start) + duration

    def prompt_assemble(self, start: float) -> tuple[float, dict[str, Any]]:
        """Assembly; a prefix-cache hit makes it (and the LLM prefill) cheaper. Returns end and attrs."""
        profile, rng = self.profile, self.rng
        tokens = int(profile.prompt_tokens_median * math.exp(profile.prompt_tokens_sigma * rng.gauss(0.0, 1.0)))
        tokens = min(max(tokens, 120), 64_000)
        cache_hit = rng.random() < prompt_cache_hit_probability(profile, tokens)
        cached = (int(tokens * cached_share(profile)) // 128) * 128 if cache_hit else 0
        attrs: dict[str, Any] = {
            "prompt_tokens": tokens,
            "cached_tokens": cached,
            "prompt_cache_hit": cache_hit,
        }
        assemble_ms = profile.assemble_base_ms + profile.assemble_per_1k_tokens_ms * tokens / 1000.0
        if cache_hit:
            assemble_ms *= profile.assemble_cache_factor
        duration = _round(assemble_ms * math.exp(profile.assemble_sigma * rng.gauss(0.0, 1.0)) * self.shared)
        self.emit("prompt_assemble", start, duration, attrs)
        return _round(start) + duration, attrs

    def llm_ttft(self, start: float, prompt_attrs: dict[str, Any]) -> float:
        """One span per attempt (fallback levels >= 1 retry on a backup). Returns the last end."""
        profile, rng = self.profile, self.rng
        factor = self.shared * profile.llm_factor
        if self.labels["route"] == "fast":
            factor *= profile.fast_route_factor
        attrs = dict(prompt_attrs)
        if profile.speculative:
            accept = _draft_accept_rate(rng, profile)
            attrs["draft_accept_rate"] = accept
            factor *= speculative_multiplier(accept)
        uncached = prompt_attrs["prompt_tokens"] - prompt_attrs["cached_tokens"]
        attempts = 2 if self.labels["fallback_level"] >= 1 else 1
        t = start
        for attempt in range(1, attempts + 1):
            # A failed first attempt is abandoned part-way, at the client's timeout.
            share = 0.6 if attempt < attempts else 1.0
            duration = _round(_llm_attempt_ms(rng, profile, uncached, factor) * share)
            self.emit("llm_ttft", t, duration, attrs, attempt)
            end = _round(t) + duration
            t = end + _gap(rng, profile.stage_gap_ms)
        return end


def simulate_request(
    rng: random.Random, profile: RequestProfile, t0_ms: float, request_id: str
) -> list[dict[str, Any]]:
    """The stage events of one request that starts at ``t0_ms`` (epoch ms), as contract dicts.

    Deterministic for the state of ``rng``. Every dict validates as ``schemas.events.StageEvent`` and
    carries an ``event_id`` (``<request_id>/<stage>/<attempt>``). Order: by stage start, not emission.
    """
    request = _Request(rng, profile, request_id)
    request.emit("request_start", t0_ms, None, {"trace_id": f"{rng.getrandbits(128):032x}"})
    end = request.retrieval(t0_ms + _gap(rng, profile.start_gap_ms))
    end, prompt_attrs = request.prompt_assemble(end + _gap(rng, profile.stage_gap_ms))
    end = request.llm_ttft(end + _gap(rng, profile.stage_gap_ms), prompt_attrs)
    request.emit("first_token", end + _gap(rng, profile.first_token_gap_ms), None, {})
    return request.events
