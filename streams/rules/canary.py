"""TTFTCanaryFailed: the canary arm against the stable arm, per tenant x stage, over the same windows.

Each evaluation yields one :class:`CanaryVerdict` (a ``canary_verdicts`` row) with both the mix-adjusted
verdict and the naive one, so a reader can see what the adjustment changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from streams.core.sketch import LatencySketch
from streams.rules.canary_stats import (
    ArmComparison,
    Judgement,
    compare_mix_adjusted,
    compare_naive,
    judge,
)
from streams.rules.history import WindowHistory, merge_sketches
from streams.rules.model import CanaryVerdict
from streams.rules_config import CanaryRule

#: (tenant, version, stage) -> per-window sketch
ArmHistory = WindowHistory[tuple[str, str, str], LatencySketch]
#: (tenant, version, stage) -> per-window {stratum: sketch}
StrataHistory = WindowHistory[tuple[str, str, str], dict[str, LatencySketch]]


def _arm_sketch(
    history: ArmHistory,
    tenant: str,
    versions: Iterable[str],
    stage: str,
    now: float,
    span: int,
    accuracy: float,
) -> LatencySketch:
    parts = [sk for v in versions for sk in history.recent((tenant, v, stage), now, span)]
    return merge_sketches(parts, accuracy)


def _arm_strata(
    history: StrataHistory,
    tenant: str,
    versions: Iterable[str],
    stage: str,
    now: float,
    span: int,
    accuracy: float,
) -> dict[str, LatencySketch]:
    grouped: dict[str, list[LatencySketch]] = {}
    for v in versions:
        for window in history.recent((tenant, v, stage), now, span):
            for stratum, sk in window.items():
                grouped.setdefault(stratum, []).append(sk)
    return {s: merge_sketches(parts, accuracy) for s, parts in grouped.items()}


def evaluate_canary(
    arms: ArmHistory,
    strata: StrataHistory,
    rule: CanaryRule,
    *,
    tenant: str,
    stage: str,
    canary_version: str,
    stable_versions: tuple[str, ...],
    now: float,
    floor_ms: float,
    slo_ms: float | None,
    degraded: bool,
    accuracy: float,
) -> tuple[CanaryVerdict, bool]:
    """The verdict for one canary version and stage; the flag says a critical gate failed (fire at once)."""
    span = rule.span_windows
    stable = _arm_sketch(arms, tenant, stable_versions, stage, now, span, accuracy)
    canary = _arm_sketch(arms, tenant, (canary_version,), stage, now, span, accuracy)
    base = CanaryVerdict(
        window_start=now,
        tenant_id=tenant,
        stage=stage,
        canary_version=canary_version,
        stable_versions=stable_versions,
        verdict="inconclusive",
        reason="",
        n_canary=canary.count,
        n_stable=stable.count,
    )
    if degraded:
        return replace(
            base, reason="telemetry degraded", explanation="window below the completeness floor: no verdict"
        ), False
    if not stable_versions:
        return replace(base, reason="no stable arm", explanation="no stable version has traffic for this tenant"), False
    naive_cmp = compare_naive(stable, canary)
    naive = judge(naive_cmp, rule, floor_ms, slo_ms)
    comparison, judgement = naive_cmp, naive
    if rule.mix_adjust:
        adjusted = compare_mix_adjusted(
            _arm_strata(strata, tenant, stable_versions, stage, now, span, accuracy),
            _arm_strata(strata, tenant, (canary_version,), stage, now, span, accuracy),
            rule,
        )
        if adjusted is not None:
            comparison, judgement = adjusted, judge(adjusted, rule, floor_ms, slo_ms)
    tail = judgement.tail
    verdict = replace(
        base,
        n_canary=comparison.n_canary,
        n_stable=comparison.n_stable,
        verdict=judgement.verdict,
        reason=judgement.reason,
        p95_canary=judgement.p95_canary,
        p95_stable=judgement.p95_stable,
        ratio=judgement.ratio,
        delta_ms=judgement.delta_ms,
        tail_share_canary=tail.share_canary if tail else None,
        tail_share_stable=tail.share_stable if tail else None,
        tail_z=tail.z if tail else None,
        tail_p=tail.p_value if tail else None,
        naive_p95_canary=naive.p95_canary,
        naive_ratio=naive.ratio,
        naive_verdict=naive.verdict,
        mix_adjusted=comparison.mix_adjusted,
        mix_coverage=comparison.coverage,
        drivers=comparison.drivers,
        explanation=_explain(stage, canary_version, tenant, judgement, naive, comparison),
    )
    return verdict, judgement.critical


def _explain(stage: str, version: str, tenant: str, j: Judgement, naive: Judgement, cmp: ArmComparison) -> str:
    if j.verdict == "inconclusive":
        return f"{stage}: too few samples ({cmp.n_canary} canary, {cmp.n_stable} stable): inconclusive, not a pass"
    assert j.p95_canary is not None and j.p95_stable is not None and j.ratio is not None and j.tail is not None
    head = "fails" if j.verdict == "fail" else "passes"
    tail = j.tail
    text = (
        f"canary {version} of tenant {tenant} {head} on stage {stage} ({j.reason}): "
        f"P95 {j.p95_canary:.0f} ms vs stable {j.p95_stable:.0f} ms (x{j.ratio:.2f}, "
        f"{j.delta_ms or 0.0:+.0f} ms); share above the pooled P95 {tail.share_canary:.1%} vs "
        f"{tail.share_stable:.1%} (z={tail.z:.1f}, p={tail.p_value:.2g})"
    )
    if cmp.mix_adjusted:
        text += f"; mix-adjusted to the stable strata (coverage {cmp.coverage or 0.0:.0%})"
        if naive.verdict != j.verdict and naive.ratio is not None:
            text += f", naive comparison would {naive.verdict} at x{naive.ratio:.2f}"
    else:
        text += "; not mix-adjusted"
    if cmp.drivers:
        text += ". Strata: " + "; ".join(cmp.drivers)
    return text + "."
