"""TTFTStageRegression: a tenant's parent-stage P95 against its own trailing baseline.

Per tenant x parent stage, each closed window: P95 of the short and the long span (ending with the closing
window) over the P95 of the baseline (``baseline_windows`` windows before the ``exclude_recent_windows``
most recent ones). All three come from merged bins. Windows flagged degraded (telemetry below the
completeness floor) get no verdict and never enter a span. Sub-stage ratios are named in the annotation.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.vocabulary import SUB_STAGES_OF as SUB_STAGES_OF  # re-exported for the engine
from streams.core.sketch import LatencySketch
from streams.rules.history import RollingSum, WindowHistory, merge_sketches
from streams.rules.lifecycle import Signal
from streams.rules.model import Outcome
from streams.rules_config import StageRegressionRule

#: (tenant, stage) -> per-window (sketch, degraded)
StageHistory = WindowHistory[tuple[str, str], tuple[LatencySketch, bool]]


class Baselines:
    """Rolling baseline sums per (tenant, stage), advanced one window per evaluation."""

    def __init__(self, history: StageHistory, rule: StageRegressionRule, window_ms: float, accuracy: float):
        self._history = history
        self._rule = rule
        self._window_ms = window_ms
        self._accuracy = accuracy
        self._sums: dict[tuple[str, str], RollingSum] = {}

    def range(self, now: float) -> tuple[float, float]:
        """First and last window start of the baseline of the window starting at ``now``."""
        last = now - self._rule.exclude_recent_windows * self._window_ms
        return last - (self._rule.baseline_windows - 1) * self._window_ms, last

    def sketch(self, key: tuple[str, str], now: float) -> LatencySketch:
        """The baseline of ``key`` at ``now``: non-degraded windows of the range, bins summed."""
        first, last = self.range(now)
        rolling = self._sums.setdefault(key, RollingSum())
        entering = self._history.newer_than(key, rolling.last_added, last)
        rolling.advance(((ws, None if degraded else sk) for ws, (sk, degraded) in entering), first)
        return rolling.sketch(self._accuracy)

    def prune(self) -> None:
        """Forget the sums of series the history no longer holds."""
        for key in [k for k in self._sums if k not in self._history]:
            del self._sums[key]


@dataclass(frozen=True, slots=True)
class RegressionCheck:
    """One evaluation of one tenant x stage."""

    outcome: Outcome
    signal: Signal
    severity: str = "ticket"
    description: str = ""
    numbers: dict[str, float] | None = None


def _span(history: StageHistory, key: tuple[str, str], first: float, last: float, accuracy: float) -> LatencySketch:
    return merge_sketches((sk for sk, degraded in history.span(key, first, last) if not degraded), accuracy)


def check_stage(
    history: StageHistory,
    baselines: Baselines,
    rule: StageRegressionRule,
    tenant: str,
    stage: str,
    now: float,
    window_ms: float,
    floor_ms: float,
    degraded: bool,
    accuracy: float,
) -> RegressionCheck:
    """Evaluate one tenant x stage at the window starting at ``now`` (its sketch already recorded)."""
    if degraded:
        return RegressionCheck("degraded", "hold")
    key = (tenant, stage)
    short = _span(history, key, now - (rule.short_windows - 1) * window_ms, now, accuracy)
    long = _span(history, key, now - (rule.long_windows - 1) * window_ms, now, accuracy)
    base = baselines.sketch(key, now)
    if base.count < rule.min_baseline_samples:
        return RegressionCheck("insufficient_history", "hold")
    if short.count < rule.min_recent_samples:
        return RegressionCheck("inconclusive", "hold")
    p_short, p_long, p_base = short.quantile(0.95), long.quantile(0.95), base.quantile(0.95)
    if p_short is None or p_long is None or not p_base:
        return RegressionCheck("inconclusive", "hold")
    r_short, r_long = p_short / p_base, p_long / p_base
    delta = p_short - p_base
    numbers = {
        "p95_short_ms": p_short,
        "p95_long_ms": p_long,
        "p95_baseline_ms": p_base,
        "ratio_short": r_short,
        "ratio_long": r_long,
        "delta_ms": delta,
        "floor_ms": floor_ms,
        "n_short": float(short.count),
        "n_baseline": float(base.count),
    }
    if min(r_short, r_long) >= rule.ratio and delta >= floor_ms:
        outcome: Outcome = "breach"
        signal: Signal = "breach"
    elif r_short < rule.recovery_ratio or delta < floor_ms:
        outcome, signal = "ok", "clear"
    else:
        outcome, signal = "hold", "hold"
    subs = _sub_stage_text(history, baselines, rule, tenant, stage, now, window_ms, accuracy, numbers)
    description = (
        f"{stage} P95 of tenant {tenant} is {p_short:.0f} ms over the last {rule.short_windows} window(s), "
        f"x{r_short:.2f} its baseline of {p_base:.0f} ms ({rule.baseline_windows} windows before the last "
        f"{rule.exclude_recent_windows}); x{r_long:.2f} over {rule.long_windows} windows; "
        f"+{delta:.0f} ms (floor {floor_ms:.0f} ms).{subs}"
    )
    severity = "page" if r_short >= rule.page_ratio else "ticket"
    return RegressionCheck(outcome, signal, severity, description, numbers)


def _sub_stage_text(
    history: StageHistory,
    baselines: Baselines,
    rule: StageRegressionRule,
    tenant: str,
    stage: str,
    now: float,
    window_ms: float,
    accuracy: float,
    numbers: dict[str, float],
) -> str:
    """Sub-stage ratios over the short span, largest first (adds ``ratio_<sub>`` to ``numbers``)."""
    parts: list[tuple[float, str]] = []
    for sub in SUB_STAGES_OF.get(stage, ()):
        key = (tenant, sub)
        short = _span(history, key, now - (rule.short_windows - 1) * window_ms, now, accuracy)
        base = baselines.sketch(key, now)
        p_short, p_base = short.quantile(0.95), base.quantile(0.95)
        if p_short is None or not p_base:
            continue
        ratio = p_short / p_base
        numbers[f"ratio_{sub}"] = ratio
        parts.append((ratio, f"{sub} x{ratio:.2f} ({p_base:.0f}->{p_short:.0f} ms)"))
    if not parts:
        return ""
    return " Sub-stages: " + ", ".join(text for _, text in sorted(parts, key=lambda t: (-t[0], t[1]))) + "."
