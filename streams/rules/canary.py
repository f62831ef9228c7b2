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


def canary_span(
    arms: ArmHistory,
    rule: CanaryRule,
    tenant: str,
    stage: str,
    canary_version: str,
    stable_versions: Iterable[str],
    now: float,
    window_ms: float,
) -> tuple[int, frozenset[float]]:
    """The span (windows) and the window starts both arms are compared over.

    The smallest span of at least ``span_windows`` windows, up to ``max_span_windows``, in which both arms
    hold ``min_samples``; only windows where the canary had traffic count, for both arms, so the stable arm
    is never compared over a period the canary did not see (and the span never reaches before the canary's
    first window). The span is the whole maximum when even that lacks samples.
    """
    first = now - (rule.max_span_windows - 1) * window_ms
    canary_n = {ws: sk.count for ws, sk in arms.items((tenant, canary_version, stage), first, now)}
    stable_n: dict[float, int] = {}
    for version in stable_versions:
        for ws, sk in arms.items((tenant, version, stage), first, now):
            if ws in canary_n:
                stable_n[ws] = stable_n.get(ws, 0) + sk.count
    n_c = n_s = 0
    span = rule.max_span_windows
    for back in range(rule.max_span_windows):
        ws = now - back * window_ms
        n_c += canary_n.get(ws, 0)
        n_s += stable_n.get(ws, 0)
        if back + 1 >= rule.span_windows and n_c >= rule.min_samples and n_s >= rule.min_samples:
            span = back + 1
            break
    oldest = now - (span - 1) * window_ms
    windows = frozenset(ws for ws in canary_n if ws >= oldest)
    lifetime = round((now - min(canary_n)) / window_ms) + 1 if canary_n else 1
    return min(span, lifetime), windows


def _arm_sketch(
    history: ArmHistory,
    tenant: str,
    versions: Iterable[str],
    stage: str,
    windows: frozenset[float],
    accuracy: float,
) -> LatencySketch:
    first, last = (min(windows), max(windows)) if windows else (0.0, -1.0)
    parts = [sk for v in versions for ws, sk in history.items((tenant, v, stage), first, last) if ws in windows]
    return merge_sketches(parts, accuracy)


def _arm_strata(
    history: StrataHistory,
    tenant: str,
    versions: Iterable[str],
    stage: str,
    windows: frozenset[float],
    accuracy: float,
) -> dict[str, LatencySketch]:
    first, last = (min(windows), max(windows)) if windows else (0.0, -1.0)
    grouped: dict[str, list[LatencySketch]] = {}
    for v in versions:
        for ws, window in history.items((tenant, v, stage), first, last):
            if ws not in windows:
                continue
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
    window_ms: float,
    floor_ms: float,
    slo_ms: float | None,
    degraded: bool,
    accuracy: float,
) -> tuple[CanaryVerdict, bool]:
    """The verdict for one canary version and stage; the flag says a critical gate failed (fire at once)."""
    span, windows = canary_span(arms, rule, tenant, stage, canary_version, stable_versions, now, window_ms)
    stable = _arm_sketch(arms, tenant, stable_versions, stage, windows, accuracy)
    canary = _arm_sketch(arms, tenant, (canary_version,), stage, windows, accuracy)
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
        span_windows=span,
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
            _arm_strata(strata, tenant, stable_versions, stage, windows, accuracy),
            _arm_strata(strata, tenant, (canary_version,), stage, windows, accuracy),
            rule,
        )
        if adjusted is not None:
            comparison, judgement = adjusted, judge(adjusted, rule, floor_ms, slo_ms)
    explanation = _explain(stage, canary_version, tenant, judgement, naive, comparison, span, rule.min_samples)
    verdict = _filled(base, comparison, judgement, naive, explanation)
    return verdict, judgement.critical


def _filled(
    base: CanaryVerdict, comparison: ArmComparison, judgement: Judgement, naive: Judgement, explanation: str
) -> CanaryVerdict:
    """The verdict row: the judged comparison's numbers beside the naive ones."""
    tail = judgement.tail
    return replace(
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
        explanation=explanation,
    )


def _explain(
    stage: str, version: str, tenant: str, j: Judgement, naive: Judgement, cmp: ArmComparison, span: int, need: int
) -> str:
    if j.verdict in ("inconclusive", "insufficient_traffic"):
        return (
            f"{stage}: too few samples over {span} window(s) ({cmp.n_canary} canary, {cmp.n_stable} stable; "
            f"{need} per arm needed): {j.verdict}, not a pass"
        )
    assert j.p95_canary is not None and j.p95_stable is not None and j.ratio is not None and j.tail is not None
    head = "fails" if j.verdict == "fail" else "passes"
    tail = j.tail
    text = (
        f"canary {version} of tenant {tenant} {head} on stage {stage} ({j.reason}) over {span} window(s): "
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
