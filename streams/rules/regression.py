"""TTFTStageRegression: a tenant's parent-stage P95 against its own trailing baseline.

Per tenant x parent stage, each closed window: P95 of the short and the long span (ending with the closing
window) over the P95 of the baseline (``baseline_windows`` windows ending before the long span begins). All
three come from merged bins. Windows flagged degraded (telemetry below the completeness floor) get no
verdict and never enter a span. Sub-stage ratios are named in the annotation.

Spans grow to the evidence (:func:`choose_spans`): a tenant at 0.5 requests/s is judged over ~18 windows, one
at 100 requests/s over one, both with the same sample gate. Incidents and the baseline: the windows of an
incident that resolved on recovery (from going pending to resolving) are kept out of the series' baseline,
like degraded ones (:meth:`Baselines.exclude`), so the baseline never absorbs a resolved regression and a
second one soon after is judged against the level before the first, not hidden by it. An incident that
resolved because the baseline caught up with it (a lasting new level) stays in: the new level is the new
normal, and it does not fire again. Spans themselves may cover windows before a resolution: those windows
can only make a new breach more visible, never less.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.vocabulary import SUB_STAGES_OF as SUB_STAGES_OF  # re-exported for the engine
from streams.core.sketch import LatencySketch
from streams.rules.history import RollingSum, WindowHistory, merge_sketches
from streams.rules.lifecycle import Signal
from streams.rules.model import AlertTransition, Outcome
from streams.rules_config import StageRegressionRule

#: (tenant, stage) -> per-window (sketch, degraded)
StageHistory = WindowHistory[tuple[str, str], tuple[LatencySketch, bool]]


@dataclass(slots=True)
class _BaselineSum:
    """A rolling baseline of one series and the range it currently covers."""

    rolling: RollingSum = field(default_factory=RollingSum)
    first: float = float("-inf")
    last: float = float("-inf")


class Baselines:
    """Rolling baseline sums per (tenant, stage); the range follows the span in use, and resolved
    incidents are kept out of it."""

    def __init__(self, history: StageHistory, rule: StageRegressionRule, window_ms: float, accuracy: float):
        self._history = history
        self._rule = rule
        self._window_ms = window_ms
        self._accuracy = accuracy
        self._sums: dict[tuple[str, str], _BaselineSum] = {}
        self._excluded: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def range(self, now: float, long_len: int) -> tuple[float, float]:
        """First and last window start of the baseline at ``now`` for a long span of ``long_len`` windows."""
        last = now - max(self._rule.exclude_recent_windows, long_len) * self._window_ms
        return last - (self._rule.baseline_windows - 1) * self._window_ms, last

    def sketch(self, key: tuple[str, str], now: float, long_len: int) -> LatencySketch:
        """The baseline of ``key``: non-degraded, non-incident windows of the range, bins summed."""
        first, last = self.range(now, long_len)
        cur = self._sums.get(key)
        if cur is None or first < cur.first:  # the range reaches further back than the sum kept: rebuild
            cur = self._sums[key] = _BaselineSum()
        elif last < cur.last:
            cur.rolling.retreat(last)
        cur.first, cur.last = first, last
        entering = self._history.newer_than(key, cur.rolling.last_added, last)
        excluded = self._excluded.get(key, ())
        cur.rolling.advance(
            (
                (ws, None if degraded or any(a <= ws <= b for a, b in excluded) else sk)
                for ws, (sk, degraded) in entering
            ),
            first,
        )
        return cur.rolling.sketch(self._accuracy)

    def covered(self, key: tuple[str, str], now: float, long_len: int) -> bool:
        """Whether the series' history reaches back to the baseline's first window."""
        seen = self._history.first_seen(key)
        return seen is not None and seen <= self.range(now, long_len)[0]

    def exclude(self, key: tuple[str, str], first: float, last: float) -> None:
        """Keep windows ``first..last`` (a resolved incident) out of the baseline of ``key`` from now on."""
        self._excluded.setdefault(key, []).append((first, last))
        self._sums.pop(key, None)

    def prune(self, now: float) -> None:
        """Forget the sums of series the history no longer holds, and incidents older than any baseline."""
        for key in [k for k in self._sums if k not in self._history]:
            del self._sums[key]
        horizon = now - self._rule.history_windows() * self._window_ms
        for key in list(self._excluded):
            kept = [(a, b) for a, b in self._excluded[key] if b >= horizon]
            if kept:
                self._excluded[key] = kept
            else:
                del self._excluded[key]


class IncidentMemory:
    """Which resolved regressions to keep out of their series' baselines (see the module docstring).

    Recovery: the resolving short-span P95 is back under ``recovery_ratio`` times the baseline the alert went
    pending against. Otherwise the baseline caught up with a lasting new level: that is accepted as the new
    normal and stays in (excluding it would fire the same alert again an hour later).
    """

    def __init__(self, baselines: Baselines, rule: StageRegressionRule, window_ms: float) -> None:
        self._baselines = baselines
        self._rule = rule
        self._window_ms = window_ms
        #: (tenant, stage) -> baseline P95 when its alert went pending
        self._pending_baseline: dict[tuple[str, str], float] = {}

    def observe(self, tenant: str, stage: str, steps: list[AlertTransition]) -> None:
        """Fold the transitions of one tenant x stage regression alert."""
        key = (tenant, stage)
        for t in steps:
            if t.state != "resolved":
                self._pending_baseline.setdefault(key, t.numbers.get("p95_baseline_ms", 0.0))
                continue
            before = self._pending_baseline.pop(key, 0.0)
            recovered = (
                before > 0.0 and t.numbers.get("p95_short_ms", float("inf")) < before * self._rule.recovery_ratio
            )
            if t.fired_at is not None and recovered:
                for s in (stage, *SUB_STAGES_OF.get(stage, ())):
                    self._baselines.exclude((tenant, s), t.active_at, t.window_start - self._window_ms)

    def prune(self, active: Callable[[str, str], object | None]) -> None:
        """Forget alerts that are no longer active (resolved elsewhere, e.g. as stale)."""
        for key in [k for k in self._pending_baseline if active(*k) is None]:
            del self._pending_baseline[key]


@dataclass(frozen=True, slots=True)
class Spans:
    """The spans one evaluation used: window counts and the short span's sample count."""

    short_len: int
    long_len: int
    samples: int


def choose_spans(history: StageHistory, key: tuple[str, str], rule: StageRegressionRule, now: float, w: float) -> Spans:
    """The smallest short span (``short_windows`` .. ``max_span_windows``) holding ``min_recent_samples``
    non-degraded samples; the long span keeps its lead over it, capped at ``max_span_windows``."""
    counts = [0] * rule.max_span_windows
    for ws, (sk, degraded) in history.items(key, now - (rule.max_span_windows - 1) * w, now):
        if not degraded:
            counts[round((now - ws) / w)] += sk.count
    short_len, samples = rule.short_windows, sum(counts[: rule.short_windows])
    while samples < rule.min_recent_samples and short_len < rule.max_span_windows:
        samples += counts[short_len]
        short_len += 1
    long_len = min(rule.max_span_windows, short_len + rule.long_windows - rule.short_windows)
    return Spans(short_len, long_len, samples)


@dataclass(frozen=True, slots=True)
class RegressionCheck:
    """One evaluation of one tenant x stage."""

    outcome: Outcome
    signal: Signal
    severity: str = "ticket"
    description: str = ""
    numbers: dict[str, float] | None = None
    span_windows: int = 0
    samples: int = 0


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
    spans = choose_spans(history, key, rule, now, window_ms)
    base = baselines.sketch(key, now, spans.long_len)
    if base.count < rule.min_baseline_samples:
        covered = baselines.covered(key, now, spans.long_len)
        lacking: Outcome = "insufficient_traffic" if covered else "insufficient_history"
        return RegressionCheck(lacking, "hold", span_windows=spans.short_len, samples=spans.samples)
    if spans.samples < rule.min_recent_samples:
        return RegressionCheck("insufficient_traffic", "hold", span_windows=spans.short_len, samples=spans.samples)
    short = _span(history, key, now - (spans.short_len - 1) * window_ms, now, accuracy)
    long = _span(history, key, now - (spans.long_len - 1) * window_ms, now, accuracy)
    p_short, p_long, p_base = short.quantile(0.95), long.quantile(0.95), base.quantile(0.95)
    if p_short is None or p_long is None or not p_base:
        return RegressionCheck("inconclusive", "hold", span_windows=spans.short_len, samples=spans.samples)
    r_short, r_long, delta = p_short / p_base, p_long / p_base, p_short - p_base
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
        "span_windows": float(spans.short_len),
        "long_span_windows": float(spans.long_len),
    }
    outcome, signal = _decide(rule, r_short, r_long, delta, floor_ms)
    subs = _sub_stage_text(history, baselines, tenant, stage, now, window_ms, accuracy, spans, numbers)
    description = (
        f"{stage} P95 of tenant {tenant} is {p_short:.0f} ms over the last {spans.short_len} window(s) "
        f"({short.count} samples), x{r_short:.2f} its baseline of {p_base:.0f} ms ({rule.baseline_windows} "
        f"windows before the last {max(rule.exclude_recent_windows, spans.long_len)}); x{r_long:.2f} over "
        f"{spans.long_len} windows; +{delta:.0f} ms (floor {floor_ms:.0f} ms).{subs}"
    )
    severity = "page" if r_short >= rule.page_ratio else "ticket"
    return RegressionCheck(outcome, signal, severity, description, numbers, spans.short_len, spans.samples)


def _decide(
    rule: StageRegressionRule, r_short: float, r_long: float, delta: float, floor_ms: float
) -> tuple[Outcome, Signal]:
    """Breach on both spans above ``ratio`` (and the floor); clear under ``recovery_ratio``; else hold."""
    if min(r_short, r_long) >= rule.ratio and delta >= floor_ms:
        return "breach", "breach"
    if r_short < rule.recovery_ratio or delta < floor_ms:
        return "ok", "clear"
    return "hold", "hold"


def _sub_stage_text(
    history: StageHistory,
    baselines: Baselines,
    tenant: str,
    stage: str,
    now: float,
    window_ms: float,
    accuracy: float,
    spans: Spans,
    numbers: dict[str, float],
) -> str:
    """Sub-stage ratios over the short span, largest first (adds ``ratio_<sub>`` to ``numbers``)."""
    parts: list[tuple[float, str]] = []
    for sub in SUB_STAGES_OF.get(stage, ()):
        key = (tenant, sub)
        short = _span(history, key, now - (spans.short_len - 1) * window_ms, now, accuracy)
        base = baselines.sketch(key, now, spans.long_len)
        p_short, p_base = short.quantile(0.95), base.quantile(0.95)
        if p_short is None or not p_base:
            continue
        ratio = p_short / p_base
        numbers[f"ratio_{sub}"] = ratio
        parts.append((ratio, f"{sub} x{ratio:.2f} ({p_base:.0f}->{p_short:.0f} ms)"))
    if not parts:
        return ""
    return " Sub-stages: " + ", ".join(text for _, text in sorted(parts, key=lambda t: (-t[0], t[1]))) + "."


def stage_shift(
    history: StageHistory,
    baselines: Baselines,
    rule: StageRegressionRule,
    tenant: str,
    stage: str,
    now: float,
    window_ms: float,
    accuracy: float,
) -> tuple[float, float] | None:
    """One tenant x stage's P95 over the regression rule's short span and its baseline P95, judged as that
    rule judges them (same spans, same sample gates); ``None`` when either span lacks its samples."""
    key = (tenant, stage)
    spans = choose_spans(history, key, rule, now, window_ms)
    if spans.samples < rule.min_recent_samples:
        return None
    base = baselines.sketch(key, now, spans.long_len)
    if base.count < rule.min_baseline_samples:
        return None
    short = _span(history, key, now - (spans.short_len - 1) * window_ms, now, accuracy)
    p_short, p_base = short.quantile(0.95), base.quantile(0.95)
    if p_short is None or p_base is None:
        return None
    return p_short, p_base
