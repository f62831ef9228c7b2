"""What-if replay (``ttft whatif``): the TTFT percentiles if a stage were faster, from each request's stages.

Stage P95s do not add up to the TTFT P95 (the slowest requests of one stage are mostly not the slowest of
another), so a stage's P95 change does not say what TTFT's P95 does. Replaying every stored request with
the stage changed does, because each complete record carries its own stage durations (Coz's virtual
speedups and per-request critical paths, applied to the records). Pure: numpy arrays in, numbers out.

Per complete request (a NULL stage is absent: NaN in the arrays):

- TTFT = retrieval + prompt_assemble + llm_ttft + other, ``other_ms`` being the join's signed gap. The
  prediction is the observed TTFT minus, over the three parents, (before - after): the gap is kept as it
  is, and a request whose stages did not change keeps its observed TTFT bit for bit.
- retrieval's critical path is its recall, then rerank: ``vector + bm25`` when recall ran serially,
  ``max(vector, bm25)`` when in parallel, the one leg when single. A sub-stage lever changes retrieval by
  the change of that path (cutting rerank by 40 ms shortens retrieval, and TTFT, by 40 ms; shortening the
  shorter of two parallel legs shortens nothing); what lies off the path (fusion, queueing) stays.
- Scaling retrieval scales its sub-stages too (the whole stage runs faster); a cut or cap of retrieval
  leaves them as they are (which part the milliseconds come from is unknown).
- Levers apply in order, each to the stages as the levers before it left them (a ``pNN`` cap is the
  stage's percentile at that point; donors lend the values they have then).
- Floors: every stage at 0; a predicted TTFT not below the request's longest remaining parent stage nor
  0 (its stages run between its start and its first token: only a negative gap, i.e. overlapping spans,
  could take the subtraction lower), and the floor never lifts it above the observed TTFT.

Serial recall is the record's ``recall_mode`` = ``serial``: the join saw both recall spans and they did
not overlap. A record without a recall mode (its two recalls came in different late amendments, so their
overlap is unknown) counts as serial when both legs and rerank fit inside retrieval.

Donor levers (``--all-cache-hits``, ``--route-all``) replace a request's ``llm_ttft`` by that of a random
donor of the same prompt-token bucket (:data:`streams.core.stages.PROMPT_BUCKETS`), with a seeded
generator, and refuse when a bucket that has recipients has fewer than ``min_donors`` donors. The draws
are matched to the recipients by rank within the bucket: the slowest recipient takes the slowest draw. A
request slow in every stage (a busy host, a long context) stays slow after the fix; pairing draws at
random would make the slow tail faster than it is (on the demo's story at 20k requests a phase, random
pairing put the stable-prefix phase's TTFT P95 about 12 points lower than rank matching).

``--cached-share S`` rescales the ``llm_ttft`` of every request that is a prompt-cache hit at that point (the
stored hits, and the recipients of an earlier ``--all-cache-hits``) to a hit that caches ``S`` of its prompt:
``llm_ttft * (a + b * tokens * (1 - S)) / (a + b * uncached)``, the line ``a + b * uncached tokens`` fitted
(least squares) on the replayed requests with known prompt and cached tokens. A stored hit's uncached tokens
are its own; a recipient's are its prompt times one minus the stored hits' median cached share (its donor's
kind of hit). A cache-hit lever given right before ``--cached-share`` draws no donors: it only picks the
misses that become hits, whose own ``llm_ttft`` (their whole prompt uncached) is then rescaled, so the
prediction needs no hits of the same prompt size, which a short span rarely has. The ratio keeps each
request's own slowness; the fit needs :data:`MIN_FIT_REQUESTS` requests and a prefill cost (a slope worth
1 % of the base at the median uncached tokens), else the lever refuses.

``--route-share ROUTE=SHARE:FACTOR`` needs no donors: requests drawn at random (seeded) from those off the
route move onto it until ``SHARE`` of all requests are on it, their ``llm_ttft`` times ``FACTOR``. It is for a
route with no traffic yet (the demo's routing fix), where ``--route-all`` has nothing to draw from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from schemas.vocabulary import PARENT_STAGES, SUB_STAGES
from streams.core.sketch import rank_lower
from streams.core.stages import PROMPT_BUCKETS
from streams.core.whatif_levers import (
    LEVER_STAGES,
    AllCacheHits,
    CachedShare,
    Cap,
    Cut,
    Lever,
    ParallelRecall,
    RouteAll,
    RouteShare,
    Scale,
    lever_json,
)
from streams.core.whatif_stats import REPORTED, FloatArray, bootstrap_interval, lower_quantile, lower_quantiles

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

#: ``recall_mode`` as stored -> its code in :attr:`RequestColumns.recall_mode` (0: NULL).
RECALL_CODES: Final[dict[str, int]] = {"serial": 1, "parallel": 2, "single": 3, "none": 4}
#: How much longer than retrieval its two legs and rerank may add up to and still count as serial (rounding).
SERIAL_SLACK_MS: Final = 1.0
#: Fewest requests with prompt and cached token counts --cached-share fits its prefill line on.
MIN_FIT_REQUESTS: Final = 20
#: Fewest donors a prompt bucket needs before its recipients may draw from them.
DEFAULT_MIN_DONORS: Final = 10
DEFAULT_RESAMPLES: Final = 200
DEFAULT_CACHEABLE_MIN_TOKENS: Final = 1_024
#: :func:`streams.core.stages.prompt_bucket`'s edges, in :data:`PROMPT_BUCKETS` order.
_TOKEN_EDGES: Final = np.array([1_024, 4_096, 16_384])
_UNKNOWN_BUCKET: Final = len(PROMPT_BUCKETS) - 1


class WhatIfRefused(ValueError):
    """The replay cannot answer as asked: no requests, too few donors, a route no request took."""


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """The replayable requests (complete, with a TTFT), one array element per request.

    ``stages`` holds every stage of :data:`LEVER_STAGES` (ms, NaN when NULL); ``recall_mode`` codes
    (:data:`RECALL_CODES`); ``prompt_tokens`` (-1 unknown); ``prompt_cache_hit`` (1 hit, 0 miss, -1
    unknown); ``route`` indexes ``route_names`` (-1: none).
    """

    ttft: FloatArray
    stages: Mapping[str, FloatArray]
    recall_mode: npt.NDArray[np.uint8]
    prompt_tokens: IntArray
    prompt_cache_hit: npt.NDArray[np.int8]
    route: npt.NDArray[np.int32]
    route_names: tuple[str, ...] = ()
    #: Cached prompt tokens (-1 unknown); ``None``: unknown for every request.
    cached_tokens: IntArray | None = None

    def __post_init__(self) -> None:
        n = len(self.ttft)
        if set(self.stages) != set(LEVER_STAGES):
            raise ValueError(f"stages must be exactly {LEVER_STAGES}")
        lengths = [len(a) for a in self.stages.values()]
        lengths += [len(self.recall_mode), len(self.prompt_tokens), len(self.prompt_cache_hit), len(self.route)]
        if self.cached_tokens is not None:
            lengths.append(len(self.cached_tokens))
        if any(length != n for length in lengths):
            raise ValueError("every column needs one value per request")
        if np.isnan(self.ttft).any():
            raise ValueError("every replayed request needs a TTFT")

    @property
    def n(self) -> int:
        return len(self.ttft)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> RequestColumns:
        """The replayable requests among record dicts (the same selection as the store read)."""
        rows = [
            r
            for r in records
            if r.get("status") == "complete" and r.get("ttft_ms") is not None and r.get("first_token_at") is not None
        ]

        def floats(column: str) -> FloatArray:
            return np.array([np.nan if r.get(column) is None else float(r[column]) for r in rows], dtype=np.float64)

        names = tuple(sorted({str(r["route"]) for r in rows if r.get("route") is not None}))
        hits = [r.get("prompt_cache_hit") for r in rows]
        return cls(
            ttft=floats("ttft_ms"),
            stages={stage: floats(f"{stage}_ms") for stage in LEVER_STAGES},
            recall_mode=np.array([RECALL_CODES.get(str(r.get("recall_mode")), 0) for r in rows], dtype=np.uint8),
            prompt_tokens=np.array(
                [-1 if r.get("prompt_tokens") is None else int(r["prompt_tokens"]) for r in rows], dtype=np.int64
            ),
            prompt_cache_hit=np.array([-1 if h is None else int(bool(h)) for h in hits], dtype=np.int8),
            route=np.array([-1 if r.get("route") is None else names.index(str(r["route"])) for r in rows], np.int32),
            route_names=names,
            cached_tokens=np.array(
                [-1 if r.get("cached_tokens") is None else int(r["cached_tokens"]) for r in rows], dtype=np.int64
            ),
        )


def prompt_bucket_codes(tokens: IntArray) -> IntArray:
    """Index in :data:`PROMPT_BUCKETS` of each prompt size (``unknown`` for -1), like ``prompt_bucket``."""
    codes: IntArray = np.searchsorted(_TOKEN_EDGES, tokens, side="right").astype(np.int64)
    return np.where(tokens < 0, _UNKNOWN_BUCKET, codes)


def serial_recall(columns: RequestColumns) -> BoolArray:
    """Requests whose two recall legs ran one after the other (module docstring)."""
    vector, bm25 = columns.stages["vector_recall"], columns.stages["bm25_recall"]
    both = ~np.isnan(vector) & ~np.isnan(bm25)
    parts = np.nan_to_num(vector) + np.nan_to_num(bm25) + np.nan_to_num(columns.stages["rerank"])
    fits = parts <= columns.stages["retrieval"] + SERIAL_SLACK_MS
    code = columns.recall_mode
    serial: BoolArray = both & ((code == RECALL_CODES["serial"]) | ((code == 0) & fits))
    return serial


@dataclass(frozen=True, slots=True)
class LeverReport:
    """What one lever did: how many requests it changed, and its details (cap, donors)."""

    lever: Lever
    changed: int
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**lever_json(self.lever), "changed": self.changed, **self.detail}


@dataclass(frozen=True, slots=True)
class Replay:
    """Per request: the observed and predicted TTFT, every stage before and after the levers (an untouched
    stage is the same array), and which requests still recall serially."""

    observed: FloatArray
    predicted: FloatArray
    before: Mapping[str, FloatArray]
    after: Mapping[str, FloatArray]
    serial: BoolArray
    levers: tuple[LeverReport, ...]


class _Stages:
    """The stages as the levers so far left them. Arrays are replaced, never written in place, so an
    untouched stage is still the caller's array (``after is before``)."""

    def __init__(self, columns: RequestColumns, rng: np.random.Generator, min_donors: int, min_tokens: int) -> None:
        self.columns = columns
        self.stages = dict(columns.stages)
        self.serial = serial_recall(columns)
        self.buckets = prompt_bucket_codes(columns.prompt_tokens)
        #: Prompt-cache hits as the levers so far left them, and the recipients of --all-cache-hits among them.
        self.hit: BoolArray = columns.prompt_cache_hit == 1
        self.made_hit: BoolArray = np.zeros(columns.n, dtype=np.bool_)
        #: Misses a cache-hit lever turned into hits without donors (--cached-share follows it).
        self.flipped: BoolArray = np.zeros(columns.n, dtype=np.bool_)
        self.rng = rng
        self.min_donors = min_donors
        self.min_tokens = min_tokens

    def apply(self, lever: Lever, *, modelled: bool = False) -> LeverReport:
        if isinstance(lever, Scale | Cut | Cap):
            return self._stage_lever(lever)
        if isinstance(lever, ParallelRecall):
            changed = int(np.count_nonzero(self.serial))
            path = self._path()
            self.serial = np.zeros_like(self.serial)
            self._roll_up(path)
            return LeverReport(lever, changed)
        if isinstance(lever, AllCacheHits):
            hit, tokens = self.columns.prompt_cache_hit, self.columns.prompt_tokens
            cacheable = (tokens >= self.min_tokens) | (tokens < 0)
            kept = int(np.count_nonzero((hit == 0) & ~cacheable))
            recipients = self._turning_hits(lever.share, (hit == 0) & cacheable, (hit == 1) & cacheable)
            made = recipients & ~np.isnan(self.stages["llm_ttft"])
            self.hit = self.hit | made
            if modelled:
                self.flipped = self.flipped | made
                detail = {"not_cacheable": kept, "llm_ttft": "from --cached-share"}
                return LeverReport(lever, int(np.count_nonzero(made)), detail)
            self.made_hit = self.made_hit | made
            return self._donate(lever, recipients, hit == 1, {"not_cacheable": kept})
        if isinstance(lever, CachedShare):
            return self._cached_share(lever)
        if isinstance(lever, RouteShare):
            return self._route_share(lever)
        names = self.columns.route_names
        if lever.route not in names or not np.any(self.columns.route == names.index(lever.route)):
            known = ", ".join(repr(n) for n in names) or "none"
            raise WhatIfRefused(f"{lever.text}: no replayed request was served on route {lever.route!r} ({known})")
        on_route = self.columns.route == names.index(lever.route)
        return self._donate(lever, ~on_route, on_route, {})

    def _stage_lever(self, lever: Scale | Cut | Cap) -> LeverReport:
        old = self.stages[lever.stage]
        detail: dict[str, Any] = {}
        if isinstance(lever, Scale):
            new = old * lever.factor
        elif isinstance(lever, Cut):
            new = np.maximum(old - lever.ms, 0.0)
        else:
            limit = lever.ms
            if lever.percentile is not None:
                limit = lower_quantile(old, lever.percentile / 100.0)
                if limit is None:
                    raise WhatIfRefused(f"{lever.text}: no replayed request has a {lever.stage} to take its percentile")
            assert limit is not None
            detail["cap_ms"] = limit
            new = np.minimum(old, limit)
        changed = int(np.count_nonzero(new != old) - np.count_nonzero(np.isnan(old)))
        if lever.stage in SUB_STAGES:
            path = self._path()
            self.stages[lever.stage] = new
            self._roll_up(path)
        else:
            self.stages[lever.stage] = new
            if lever.stage == "retrieval" and isinstance(lever, Scale):
                for sub in SUB_STAGES:
                    self.stages[sub] = self.stages[sub] * lever.factor
        return LeverReport(lever, changed, detail)

    def _turning_hits(self, share: float, misses: BoolArray, hits: BoolArray) -> BoolArray:
        """The misses that become hits: all of them, or random ones until ``share`` of the cacheable hit."""
        if share >= 1.0:
            return misses
        stored = int(np.count_nonzero(hits))
        wanted = round(share * (int(np.count_nonzero(misses)) + stored)) - stored
        candidates = np.flatnonzero(misses)
        llm = np.nan_to_num(self.stages["llm_ttft"])
        # In the order of their TTFT and llm_ttft, so the draw does not depend on the order rows were read in.
        candidates = candidates[np.lexsort((llm[candidates], self.columns.ttft[candidates]))]
        chosen = self.rng.choice(candidates, size=min(max(wanted, 0), len(candidates)), replace=False)
        out: BoolArray = np.zeros_like(misses)
        out[chosen] = True
        return out

    def _cached_share(self, lever: CachedShare) -> LeverReport:
        """Hits' llm_ttft rescaled along the fitted prefill line to a hit that caches ``share`` of its prompt."""
        columns = self.columns
        tokens = columns.prompt_tokens.astype(np.float64)
        cached_ints = columns.cached_tokens if columns.cached_tokens is not None else np.full(columns.n, -1)
        cached = cached_ints.astype(np.float64)
        observed_llm = columns.stages["llm_ttft"]
        known = (tokens > 0) & (cached >= 0) & (cached <= tokens) & ~np.isnan(observed_llm)
        if np.count_nonzero(known) < MIN_FIT_REQUESTS:
            raise WhatIfRefused(
                f"{lever.text}: {np.count_nonzero(known):,} replayed request(s) have prompt and cached token counts "
                f"(it needs {MIN_FIT_REQUESTS} to fit llm_ttft over uncached tokens)"
            )
        uncached = tokens[known] - cached[known]
        slope, base = np.polyfit(uncached, observed_llm[known], 1) if np.ptp(uncached) > 0 else (0.0, 0.0)
        # The prefill a typical request's uncached tokens cost: under 1 % of the fitted base is no cost at all.
        if not slope * float(np.median(uncached)) > 0.01 * abs(base):
            raise WhatIfRefused(
                f"{lever.text}: llm_ttft does not grow with uncached prompt tokens in the replayed requests "
                "(no prefill cost to save)"
            )
        stored_hits = known & (columns.prompt_cache_hit == 1)
        typical = float(np.median(cached[stored_hits] / tokens[stored_hits])) if stored_hits.any() else 0.0
        own = np.where(self.flipped, tokens, tokens - cached)  # a flipped miss: its whole prompt was uncached
        before = np.where(self.made_hit & ~self.flipped, tokens * (1.0 - typical), own)
        target = self.hit & (tokens > 0) & (self.made_hit | self.flipped | (cached >= 0))
        old_cost = base + slope * before
        new_cost = np.maximum(base + slope * tokens * (1.0 - lever.share), 0.0)
        target &= old_cost > 0.0
        llm = self.stages["llm_ttft"]
        factor = np.divide(new_cost, old_cost, out=np.ones_like(old_cost), where=target)
        self.stages["llm_ttft"] = np.where(target, llm * factor, llm)
        detail = {"base_ms": float(base), "ms_per_1k_uncached": float(slope * 1000.0), "stored_share": typical}
        return LeverReport(lever, int(np.count_nonzero(target & ~np.isnan(llm))), detail)

    def _route_share(self, lever: RouteShare) -> LeverReport:
        """A random set of requests off the route moves onto it, until ``share`` of all are on it."""
        names = self.columns.route_names
        on_route = self.columns.route == (names.index(lever.route) if lever.route in names else -2)
        already = int(np.count_nonzero(on_route))
        llm = self.stages["llm_ttft"]
        off = np.flatnonzero(~on_route)
        # In the order of their TTFT and llm_ttft, so the draw does not depend on the order rows were read in.
        off = off[np.lexsort((llm[off], self.columns.ttft[off]))]
        moving = min(max(round(lever.share * self.columns.n) - already, 0), len(off))
        chosen = self.rng.choice(off, size=moving, replace=False)
        new = llm.copy()
        new[chosen] = llm[chosen] * lever.factor
        self.stages["llm_ttft"] = new
        return LeverReport(lever, moving, {"already": already})

    def _path(self) -> FloatArray:
        """retrieval's critical path through its sub-stages: recall (serial: both legs; else the longer), rerank."""
        vector = np.nan_to_num(self.stages["vector_recall"])
        bm25 = np.nan_to_num(self.stages["bm25_recall"])
        recall = np.where(self.serial, vector + bm25, np.maximum(vector, bm25))
        path: FloatArray = recall + np.nan_to_num(self.stages["rerank"])
        return path

    def _roll_up(self, path_before: FloatArray) -> None:
        change = path_before - self._path()
        retrieval = self.stages["retrieval"]
        self.stages["retrieval"] = np.where(change == 0.0, retrieval, np.maximum(retrieval - change, 0.0))

    def _donate(
        self, lever: AllCacheHits | RouteAll, recipients: BoolArray, donors: BoolArray, detail: dict[str, Any]
    ) -> LeverReport:
        """Recipients' llm_ttft := a random donor's of the same prompt bucket; refuses a short bucket."""
        llm = self.stages["llm_ttft"]
        present = ~np.isnan(llm)
        recipients, donors = recipients & present, donors & present
        new = llm.copy()
        buckets: dict[str, dict[str, int]] = {}
        short: list[str] = []
        for code, name in enumerate(PROMPT_BUCKETS):
            takes = recipients & (self.buckets == code)
            count = int(np.count_nonzero(takes))
            if not count:
                continue
            # Sorted, so the draws depend on the donors' values and the seed, not on the order rows were read in.
            pool = np.sort(llm[donors & (self.buckets == code)])
            buckets[name] = {"recipients": count, "donors": len(pool)}
            if len(pool) < self.min_donors:
                short.append(f"prompts {name}: {len(pool):,} donor(s) for {count:,} request(s)")
                continue
            # Matched by rank: the slowest recipient takes the slowest draw (see the module docstring).
            draws = np.sort(pool[self.rng.integers(0, len(pool), count)])
            indices = np.flatnonzero(takes)
            new[indices[np.argsort(llm[indices], kind="stable")]] = draws
        if short:
            raise WhatIfRefused(
                f"{lever.text}: too few donors (a prompt bucket needs at least {self.min_donors}): "
                + "; ".join(short)
                + f", of {self.columns.n:,} requests replayed (lower --min-donors, or widen the span)"
            )
        self.stages["llm_ttft"] = new
        recipients_n = sum(b["recipients"] for b in buckets.values())
        detail |= {"donors": sum(b["donors"] for b in buckets.values()), "buckets": buckets}
        return LeverReport(lever, recipients_n, detail)

    def predicted(self) -> FloatArray:
        observed = self.columns.ttft
        reduction = np.zeros_like(observed)
        longest = np.zeros_like(observed)
        for stage in PARENT_STAGES:
            before, after = self.columns.stages[stage], self.stages[stage]
            if after is not before:
                reduction += np.nan_to_num(before) - np.nan_to_num(after)
            longest = np.fmax(longest, after)
        floor = np.minimum(observed, longest)
        predicted: FloatArray = np.maximum(observed - reduction, floor)
        return predicted


def replay(
    columns: RequestColumns,
    levers: Sequence[Lever],
    *,
    rng: np.random.Generator | None = None,
    min_donors: int = DEFAULT_MIN_DONORS,
    cacheable_min_tokens: int = DEFAULT_CACHEABLE_MIN_TOKENS,
) -> Replay:
    """Apply ``levers`` in order to every request and predict its TTFT (module docstring)."""
    state = _Stages(columns, rng if rng is not None else np.random.default_rng(0), min_donors, cacheable_min_tokens)
    # A cache-hit lever right before --cached-share only picks the new hits: --cached-share derives their
    # llm_ttft from their own (uncached) one, so no donors are drawn (or needed).
    reports = tuple(
        state.apply(lever, modelled=isinstance(lever, AllCacheHits) and isinstance(following, CachedShare))
        for lever, following in zip(levers, (*levers[1:], None), strict=False)
    )
    return Replay(
        observed=columns.ttft,
        predicted=state.predicted(),
        before=dict(columns.stages),
        after=dict(state.stages),
        serial=state.serial,
        levers=reports,
    )


def naive_p95(observed_p95: float, result: Replay) -> float:
    """The stage-table estimate: observed TTFT P95 minus the change in each changed parent stage's own P95
    (a sub-stage lever counts through its parent, retrieval)."""
    change = 0.0
    for stage in PARENT_STAGES:
        if result.after[stage] is result.before[stage]:
            continue
        before, after = lower_quantile(result.before[stage], 0.95), lower_quantile(result.after[stage], 0.95)
        if before is not None and after is not None:
            change += before - after
    return observed_p95 - change


@dataclass(frozen=True, slots=True)
class WhatIf:
    """``ttft whatif``'s answer: observed and predicted TTFT percentiles (ms) over ``requests`` requests."""

    requests: int
    observed: dict[str, float]
    predicted: dict[str, float]
    p95_ci: tuple[float, float]
    naive_p95: float
    levers: tuple[LeverReport, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "observed": dict(self.observed),
            "predicted": {**self.predicted, "p95_ci": list(self.p95_ci)},
            "naive_p95": self.naive_p95,
            "levers": [r.to_json() for r in self.levers],
        }


def _rngs(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for the donors and the bootstrap: one lever's draws never move the interval's."""
    levers, bootstrap = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(levers), np.random.default_rng(bootstrap)


def observed_percentiles(columns: RequestColumns) -> dict[str, float]:
    if columns.n == 0:
        raise WhatIfRefused("no complete requests to replay in the selection")
    return dict(zip(REPORTED, lower_quantiles(columns.ttft, list(REPORTED.values())), strict=True))


def predicted_percentiles(
    result: Replay, resamples: int, rng: np.random.Generator
) -> tuple[dict[str, float], tuple[float, float]]:
    ordered = np.sort(result.predicted)
    n = len(ordered)
    predicted = {name: float(ordered[rank_lower(q, n)]) for name, q in REPORTED.items()}
    return predicted, bootstrap_interval(ordered, REPORTED["p95"], resamples, rng)


def predict(
    columns: RequestColumns,
    levers: Sequence[Lever],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    min_donors: int = DEFAULT_MIN_DONORS,
    cacheable_min_tokens: int = DEFAULT_CACHEABLE_MIN_TOKENS,
) -> WhatIf:
    """Replay ``levers`` and summarise: percentiles, the predicted P95's bootstrap interval, the naive P95."""
    observed = observed_percentiles(columns)
    lever_rng, bootstrap_rng = _rngs(seed)
    result = replay(columns, levers, rng=lever_rng, min_donors=min_donors, cacheable_min_tokens=cacheable_min_tokens)
    predicted, ci = predicted_percentiles(result, resamples, bootstrap_rng)
    return WhatIf(columns.n, observed, predicted, ci, naive_p95(observed["p95"], result), result.levers)
