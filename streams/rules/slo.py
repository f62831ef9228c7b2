"""TTFTSLOBurn: multi-window burn rates of a tenant's TTFT SLO.

SLI: a request is good when its TTFT is within the tenant's SLO. ``slo_bad_count`` of the ``ttft`` rows
already counts timed-out and orphaned requests as bad (an outage never improves the SLI); the total is the
``ttft`` count plus those timed-out and orphans (from ``window_health``), without the ``no_first_chunk``
requests, whose TTFT is unknown (neither good nor bad). Burn rate = bad share / (1 -
target). A pair fires when both its long and short span burn faster than its threshold. A pair whose long
span reaches back before the tenant's first window has too little history and is not judged; with no
judgeable pair the rule reports ``insufficient_history`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from streams.rules.history import WindowHistory
from streams.rules.lifecycle import Signal
from streams.rules.model import Outcome
from streams.rules_config import SLOBurnRule

#: tenant -> per-window (bad, total)
BurnHistory = WindowHistory[str, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class BurnCheck:
    """One evaluation of one tenant's burn rates."""

    outcome: Outcome
    signal: Signal
    severity: str = "page"
    description: str = ""
    numbers: dict[str, float] | None = None


def _rate(history: BurnHistory, tenant: str, now: float, windows: int, budget: float) -> tuple[float, int]:
    counts = history.recent(tenant, now, windows)
    bad = sum(b for b, _ in counts)
    total = sum(t for _, t in counts)
    return ((bad / total) / budget if total else 0.0), total


def check_burn(
    history: BurnHistory,
    rule: SLOBurnRule,
    tenant: str,
    now: float,
    window_ms: float,
    slo_ms: float,
    slo_target: float,
) -> BurnCheck:
    """Evaluate every window pair of the rule for one tenant at the window starting at ``now``."""
    first = history.first_seen(tenant)
    budget = 1.0 - slo_target
    numbers: dict[str, float] = {"slo_ms": slo_ms, "slo_target": slo_target}
    burning: list[str] = []
    severities: list[str] = []
    judged = 0
    for pair in rule.pairs:
        if first is None or first > now - (pair.long_windows - 1) * window_ms:
            continue
        long_rate, long_total = _rate(history, tenant, now, pair.long_windows, budget)
        short_rate, _ = _rate(history, tenant, now, pair.short_windows, budget)
        if long_total < rule.min_long_events:
            continue
        judged += 1
        numbers[f"burn_{pair.long_windows}w"] = long_rate
        numbers[f"burn_{pair.short_windows}w"] = short_rate
        if long_rate > pair.burn_rate and short_rate > pair.burn_rate:
            burning.append(
                f"x{long_rate:.1f} over {pair.long_windows} windows and x{short_rate:.1f} over "
                f"{pair.short_windows} (threshold {pair.burn_rate:g})"
            )
            severities.append(pair.severity)
    if judged == 0:
        return BurnCheck("insufficient_history", "hold", description="too little history to judge burn rates")
    if not burning:
        return BurnCheck("ok", "clear", numbers=numbers, description=f"tenant {tenant} within its error budget")
    severity = "page" if "page" in severities else "ticket"
    description = (
        f"tenant {tenant} burns its TTFT SLO ({slo_target:.2%} of requests within {slo_ms:.0f} ms; timed-out "
        f"and orphaned requests count as bad): " + "; ".join(burning) + "."
    )
    return BurnCheck("breach", "breach", severity, description, numbers)


@dataclass(frozen=True, slots=True)
class StageMove:
    """The parent stage that moved most while a tenant burns its SLO, and the evidence for it."""

    stage: str
    #: P95 over the regression rule's short span and its baseline (None: judged by tail attribution only)
    p95_ms: float | None = None
    baseline_ms: float | None = None
    #: the stage's share of TTFT in the slowest 5 % and in typical requests of the latest attributed window
    tail_share: float | None = None
    band_share: float | None = None

    def numbers(self) -> dict[str, float]:
        """``moved_stage_*`` numbers for the alert's annotations."""
        values = {
            "moved_stage_p95_ms": self.p95_ms,
            "moved_stage_baseline_ms": self.baseline_ms,
            "moved_stage_delta_ms": None
            if self.p95_ms is None or self.baseline_ms is None
            else self.p95_ms - self.baseline_ms,
            "moved_stage_tail_share": self.tail_share,
            "moved_stage_band_share": self.band_share,
        }
        return {k: v for k, v in values.items() if v is not None}

    def describe(self) -> str:
        """One sentence for the description."""
        text = f" The stage that moved most: {self.stage}"
        if self.p95_ms is not None and self.baseline_ms is not None:
            text += (
                f", P95 {self.p95_ms:.0f} ms against its baseline {self.baseline_ms:.0f} ms "
                f"({self.p95_ms - self.baseline_ms:+.0f} ms)"
            )
        if self.tail_share is not None and self.band_share is not None:
            text += (
                f"; in the slowest 5 % of the latest attributed window it takes {self.tail_share:.0%} of TTFT "
                f"({self.band_share:.0%} in typical requests)"
            )
        elif self.p95_ms is None:
            text += " (its share of TTFT grew most from typical to the slowest requests)"
        return text + "."


def moved_stage(
    shifts: Mapping[str, tuple[float, float] | None],
    tail_share: Mapping[str, float],
    band_share: Mapping[str, float],
) -> StageMove | None:
    """The stage whose P95 rose most in ms over its baseline (``shifts``: stage -> (P95, baseline P95), in
    the rule's stage order); without any judgeable shift, the stage whose share of TTFT grows most from
    typical to the slowest requests (tail attribution); ``None`` when neither tells."""
    judged = [(stage, shift) for stage, shift in shifts.items() if shift is not None]
    stages = list(shifts)
    if judged:
        stage, (p95, base) = max(judged, key=lambda item: (item[1][0] - item[1][1], -stages.index(item[0])))
        return StageMove(stage, p95, base, tail_share.get(stage), band_share.get(stage))
    growth = {s: tail_share[s] - band_share.get(s, 0.0) for s in stages if s in tail_share}
    if not growth:
        return None
    stage = max(growth, key=lambda s: (growth[s], -stages.index(s)))
    return StageMove(stage, tail_share=tail_share[stage], band_share=band_share.get(stage))
