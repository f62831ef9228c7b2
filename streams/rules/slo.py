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
