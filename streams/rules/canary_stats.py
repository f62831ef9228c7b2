"""Canary statistics: the one-sided tail test, the stratum mix adjustment, and the gates of a verdict.

Why a tail test: a bare P95 ratio is noise below ~1000 samples per arm, and Mann-Whitney tests location,
so it misses regressions that only widen the tail. The tail test compares each arm's share above the
pooled P95 with a 2-proportion z-test (research/storage_alerting.md §6).

Why a mix adjustment: a canary that happens to get more slow traffic (cache misses, long prompts) has a
higher P95 without being slower. The canary's stratum sketches are reweighted to the stable arm's stratum
shares (bin counts scaled by ``w_s = stable_share_s / canary_share_s``) and the verdict P95 is taken from
the merged reweighted sketch. Counts are scaled by :data:`FIXED_POINT` before rounding half up, so the
result is deterministic and rounding loses almost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from streams.core.sketch import LatencySketch, merge_bins
from streams.rules.model import VerdictValue
from streams.rules_config import CanaryRule

FIXED_POINT = 64
#: A stratum slower than this (canary P95 / stable P95) is named as a driver; below it is noise.
MIN_DRIVER_RATIO = 1.05


@dataclass(frozen=True, slots=True)
class TailTest:
    """Shares of each arm above the pooled quantile, and the one-sided z-test (canary greater)."""

    threshold: float
    share_canary: float
    share_stable: float
    z: float
    p_value: float


@dataclass(frozen=True, slots=True)
class ArmComparison:
    """The two sketches a verdict compares, with their real sample counts."""

    stable: LatencySketch
    canary: LatencySketch
    n_stable: int
    n_canary: int
    mix_adjusted: bool = False
    coverage: float | None = None
    drivers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Judgement:
    """Outcome of the gates for one comparison."""

    verdict: VerdictValue
    reason: str
    critical: bool = False
    p95_canary: float | None = None
    p95_stable: float | None = None
    ratio: float | None = None
    delta_ms: float | None = None
    tail: TailTest | None = None


def scaled(sketch: LatencySketch, factor: float) -> LatencySketch:
    """The sketch with every count multiplied by ``factor`` and rounded half up (deterministic)."""
    bins = {k: int(n * factor + 0.5) for k, n in sketch.bins.items()}
    return LatencySketch.from_bins(
        {k: n for k, n in bins.items() if n},
        int(sketch.zero_count * factor + 0.5),
        relative_accuracy=sketch.relative_accuracy,
    )


def tail_test(stable: LatencySketch, canary: LatencySketch, n_stable: int, n_canary: int, q: float) -> TailTest:
    """One-sided 2-proportion z-test of ``share(canary > pooled q)`` against the stable arm's share.

    The sketches may be scaled (reweighted); shares come from them, sample sizes from the real counts.
    """
    pooled = LatencySketch.from_bins(
        merge_bins([stable.bins, canary.bins]),
        stable.zero_count + canary.zero_count,
        relative_accuracy=stable.relative_accuracy,
    )
    threshold = pooled.quantile(q) or 0.0
    p_c = canary.share_above(threshold)
    p_s = stable.share_above(threshold)
    p = (p_c * n_canary + p_s * n_stable) / (n_canary + n_stable)
    se = math.sqrt(p * (1.0 - p) * (1.0 / n_canary + 1.0 / n_stable)) if 0.0 < p < 1.0 else 0.0
    z = (p_c - p_s) / se if se > 0.0 else 0.0
    return TailTest(threshold, p_c, p_s, z, 0.5 * math.erfc(z / math.sqrt(2.0)))


def compare_naive(stable: LatencySketch, canary: LatencySketch) -> ArmComparison:
    """The arms as they are: merged sketches, no reweighting."""
    return ArmComparison(stable, canary, stable.count, canary.count)


def compare_mix_adjusted(
    stable_strata: Mapping[str, LatencySketch],
    canary_strata: Mapping[str, LatencySketch],
    rule: CanaryRule,
) -> ArmComparison | None:
    """Reweight the canary's strata to the stable mix; ``None`` when too little of the mix is comparable.

    Strata with fewer than ``min_stratum_samples`` canary samples (or no stable samples) cannot be
    reweighted; both arms are restricted to the others, which must hold ``min_mix_coverage`` of the
    stable traffic.
    """
    stable_total = sum(s.count for s in stable_strata.values())
    common = sorted(
        s
        for s, sk in canary_strata.items()
        if sk.count >= rule.min_stratum_samples and stable_strata.get(s) is not None and stable_strata[s].count
    )
    if not common or stable_total == 0:
        return None
    n_stable = sum(stable_strata[s].count for s in common)
    n_canary = sum(canary_strata[s].count for s in common)
    coverage = n_stable / stable_total
    if coverage < rule.min_mix_coverage:
        return None
    accuracy = next(iter(stable_strata.values())).relative_accuracy
    stable_parts, canary_parts = [], []
    for s in common:
        stable_parts.append(scaled(stable_strata[s], FIXED_POINT))
        weight = (stable_strata[s].count / n_stable) * n_canary / canary_strata[s].count
        canary_parts.append(scaled(canary_strata[s], weight * FIXED_POINT))
    stable = _merge(stable_parts, accuracy)
    canary = _merge(canary_parts, accuracy)
    drivers = stratum_drivers(
        {s: stable_strata[s] for s in common}, {s: canary_strata[s] for s in common}, n_stable, n_canary
    )
    return ArmComparison(stable, canary, n_stable, n_canary, True, coverage, drivers)


def stratum_drivers(
    stable_strata: Mapping[str, LatencySketch],
    canary_strata: Mapping[str, LatencySketch],
    n_stable: int,
    n_canary: int,
    top: int = 2,
) -> tuple[str, ...]:
    """Human-readable strata that drive the difference: the largest share-weighted P95 increases, then
    the largest mix shift (what the adjustment removed)."""
    slower: list[tuple[float, str]] = []
    shifts: list[tuple[float, str]] = []
    for s in sorted(stable_strata):
        share_s = stable_strata[s].count / n_stable
        share_c = canary_strata[s].count / n_canary
        p_s = stable_strata[s].quantile(0.95) or 0.0
        p_c = canary_strata[s].quantile(0.95) or 0.0
        if p_s > 0.0 and p_c >= p_s * MIN_DRIVER_RATIO:
            slower.append((share_s * (p_c - p_s), f"{s} P95 {p_s:.0f}->{p_c:.0f} ms (x{p_c / p_s:.2f})"))
        shifts.append((abs(share_c - share_s), f"{s} share {share_c:.0%} canary vs {share_s:.0%} stable"))
    out = [text for _, text in sorted(slower, key=lambda t: (-t[0], t[1]))[:top]]
    biggest_shift = max(shifts, key=lambda t: (t[0], t[1]), default=None)
    if biggest_shift is not None and biggest_shift[0] >= 0.05:
        out.append(f"mix: {biggest_shift[1]}")
    return tuple(out)


def judge(
    comparison: ArmComparison,
    rule: CanaryRule,
    floor_ms: float,
    slo_ms: float | None,
) -> Judgement:
    """Apply the gates: samples -> SLO (absolute) -> critical ratio -> relative ratio + floor + tail test."""
    if comparison.n_canary < rule.min_samples or comparison.n_stable < rule.min_samples:
        return Judgement("insufficient_traffic", "samples")
    p_c = comparison.canary.quantile(rule.tail_quantile)
    p_s = comparison.stable.quantile(rule.tail_quantile)
    if p_c is None or p_s is None:
        return Judgement("insufficient_traffic", "samples")
    ratio = p_c / p_s if p_s > 0.0 else (math.inf if p_c > 0.0 else 1.0)
    delta = p_c - p_s
    tail = tail_test(comparison.stable, comparison.canary, comparison.n_stable, comparison.n_canary, rule.tail_quantile)

    def outcome(verdict: VerdictValue, reason: str, critical: bool = False) -> Judgement:
        return Judgement(verdict, reason, critical, p_c, p_s, ratio, delta, tail)

    if slo_ms is not None and p_c > slo_ms:
        return outcome("fail", "slo")
    if ratio >= rule.critical_ratio and delta >= floor_ms:
        return outcome("fail", "critical", critical=True)
    if ratio >= rule.ratio and delta >= floor_ms and tail.p_value < rule.alpha:
        return outcome("fail", "relative")
    return outcome("pass", "within thresholds")


def _merge(parts: list[LatencySketch], relative_accuracy: float) -> LatencySketch:
    return LatencySketch.from_bins(
        merge_bins(p.bins for p in parts),
        sum(p.zero_count for p in parts),
        relative_accuracy=relative_accuracy,
    )
