"""TTFTRuleUndecidable: say so when a tenant's regression or canary rule has been unable to decide.

A series (tenant x rule x stage x version) is undecidable while its evaluations end ``insufficient_traffic``:
even the largest span lacks samples. Silence from such a series is "never looked", not "fine". When one of a
tenant's series has been undecidable for ``undecidable.after_windows`` windows, the tenant gets one ticket
(never a page) naming each series, the samples it had over which span, and what its gate needs. A series
that stops being evaluated (a rolled-back canary, a silent tenant) is forgotten after ``stale_windows``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streams.rules.lifecycle import AlertBook, AlertKey
from streams.rules.model import AlertTransition, Outcome, RuleEvaluation
from streams.rules_config import RulesConfig

#: ``note(key, outcome, span_windows)``: how the engine records an evaluation of this rule.
Note = Callable[[AlertKey, Outcome, int], None]

#: Rules whose silence must be explained: the ones that grow their span to meet a sample gate.
WATCHED_RULES: frozenset[str] = frozenset({"TTFTStageRegression", "TTFTCanaryFailed"})


@dataclass(slots=True)
class _Streak:
    since: float
    last: RuleEvaluation


class UndecidableTracker:
    """Per series, since when it has been ``insufficient_traffic`` and its latest evaluation."""

    def __init__(self, config: RulesConfig, window_ms: float) -> None:
        self._config = config
        self._window_ms = window_ms
        self._streaks: dict[tuple[str, str, str, str], _Streak] = {}

    def observe(self, evaluation: RuleEvaluation) -> None:
        """Fold one evaluation of a watched rule (others are ignored)."""
        if evaluation.rule not in WATCHED_RULES:
            return
        key = (evaluation.tenant, evaluation.rule, evaluation.stage, evaluation.version)
        if evaluation.outcome != "insufficient_traffic":
            self._streaks.pop(key, None)
            return
        streak = self._streaks.get(key)
        if streak is None:
            self._streaks[key] = _Streak(evaluation.window_start, evaluation)
        else:
            streak.last = evaluation

    def tenants(self) -> set[str]:
        """Tenants with at least one series in an undecidable streak."""
        return {key[0] for key in self._streaks}

    def overdue(self, tenant: str) -> list[tuple[float, RuleEvaluation]]:
        """The tenant's series undecidable for ``after_windows`` or more, counted up to their latest
        evaluation (a series that stopped being evaluated does not age): (since, latest evaluation)."""
        after = self._config.undecidable.after_windows
        return [
            (s.since, s.last)
            for key, s in sorted(self._streaks.items())
            if key[0] == tenant and round((s.last.window_start - s.since) / self._window_ms) + 1 >= after
        ]

    def describe(self, tenant: str, overdue: list[tuple[float, RuleEvaluation]]) -> str:
        """Why the tenant's rules cannot decide, series by series, and what would help."""
        parts = []
        for since, e in overdue:
            windows = round((e.window_start - since) / self._window_ms) + 1
            what = f"{e.stage} {e.version}".strip()
            parts.append(
                f"{e.rule} {what}: {e.samples} samples over {e.span_windows} window(s), {self._need(e.rule)} "
                f"needed, undecidable for {windows} windows"
            )
        return (
            f"tenant {tenant} has too little traffic for these rules to decide: " + "; ".join(parts) + ". "
            "Their silence means 'never looked', not 'fine'. Raise the tenant's traffic share (e.g. the canary "
            "share), or widen max_span_windows / lower the sample gate of the rule."
        )

    def _need(self, rule: str) -> str:
        if rule == "TTFTCanaryFailed":
            return f"{self._config.canary.min_samples} per arm"
        return str(self._config.stage_regression.min_recent_samples)

    def step(self, alerts: AlertBook, now: float, note: Note) -> list[AlertTransition]:
        """One ticket per tenant with an overdue series (fired at once), resolved when none is left."""
        after = self._config.undecidable.after_windows
        active = {k[1] for k, _ in alerts.active() if k[0] == "TTFTRuleUndecidable"}
        out: list[AlertTransition] = []
        for tenant in sorted(self.tenants() | active):
            key: AlertKey = ("TTFTRuleUndecidable", tenant, "", "")
            overdue = self.overdue(tenant)
            note(key, "breach" if overdue else "ok", after)
            out += alerts.step(
                key,
                "breach" if overdue else "clear",
                now,
                severity="ticket",
                immediate=True,
                summary=f"Alert rules cannot decide for tenant {tenant}: too little traffic",
                description=self.describe(tenant, overdue) if overdue else f"every rule of tenant {tenant} decides",
                numbers={"undecidable_series": float(len(overdue))},
            )
        return out

    def prune(self, now: float) -> None:
        """Forget series not evaluated for ``stale_windows`` (they stopped, they did not become decidable)."""
        horizon = now - self._config.stale_windows * self._window_ms
        for key in [k for k, s in self._streaks.items() if s.last.window_start <= horizon]:
            del self._streaks[key]
