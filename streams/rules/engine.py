"""The rule engine: folds closed windows into bounded history and alert transitions.

Contract for callers: call :meth:`RuleEngine.evaluate_window` once per closed event-time window, in
window order, including windows without rows (silence is a signal). A window at or before the last one
evaluated is ignored, so a re-close after an amendment or a replayed close changes nothing. No clock is
read: every time is the window start passed in, so a replay produces the same transitions.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import orjson

from streams.core.sketch import LatencySketch
from streams.core.tenancy import SteadyLedger
from streams.rules.canary import ArmHistory, StrataHistory, evaluate_canary
from streams.rules.draft import check_draft
from streams.rules.exemplars import ExemplarMemory, tail_shares
from streams.rules.history import WindowHistory, merge_sketches, sketch_of_row
from streams.rules.lifecycle import AlertBook, AlertKey, Signal
from streams.rules.links import EXEMPLARS, MOVED_STAGE, AlertLinks
from streams.rules.model import (
    DECIDED_OUTCOMES,
    AlertTransition,
    Outcome,
    RuleEvaluation,
    WindowEvaluation,
    WindowSnapshot,
)
from streams.rules.regression import (
    SUB_STAGES_OF,
    Baselines,
    IncidentMemory,
    StageHistory,
    check_stage,
    stage_shift,
)
from streams.rules.silence import silence_steps
from streams.rules.slo import BurnHistory, StageMove, check_burn, moved_stage
from streams.rules.snapshot import WindowFacts, stratum_of, window_facts
from streams.rules.undecidable import UndecidableTracker
from streams.rules_config import RulesConfig

if TYPE_CHECKING:  # settings.py will import streams.rules_config: no runtime import back
    from streams.settings import Settings

_NOT_SERIES = frozenset({"Watchdog", "TTFTTenantSilent", "TTFTIngestHalted"})
#: Alerts about slow requests, which carry examples of them (not silence, completeness or undecidable rules).
_LATENCY_ALERTS = frozenset({"TTFTStageRegression", "TTFTCanaryFailed", "TTFTDraftAcceptanceLow", "TTFTSLOBurn"})
_VERDICT_OUTCOME: dict[str, Outcome] = {
    "pass": "ok",
    "fail": "breach",
    "inconclusive": "inconclusive",
    "insufficient_traffic": "insufficient_traffic",
}


class RuleEngine:
    """All alert rules over a stream of closed windows; holds only bounded trailing history."""

    def __init__(self, config: RulesConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.window_ms = float(settings.windows.window_s * 1000)
        self._accuracy = settings.windows.relative_accuracy
        reg = config.stage_regression
        self._tracked_stages = set(reg.stages) | {sub for s in reg.stages for sub in SUB_STAGES_OF.get(s, ())}
        self.alerts = AlertBook(config.runbook_base_url)
        self._stages: StageHistory = WindowHistory(self.window_ms, reg.history_windows())
        self._baselines = Baselines(self._stages, reg, self.window_ms, self._accuracy)
        self._arms: ArmHistory = WindowHistory(self.window_ms, config.canary.max_span_windows)
        self._strata: StrataHistory = WindowHistory(self.window_ms, config.canary.max_span_windows)
        self._undecidable = UndecidableTracker(config, self.window_ms)
        self._last_decided: dict[AlertKey, float] = {}
        self._incidents = IncidentMemory(self._baselines, reg, self.window_ms)
        self._burn: BurnHistory = WindowHistory(self.window_ms, max(p.long_windows for p in config.slo_burn.pairs))
        self._series_seen: dict[AlertKey, float] = {}
        self._tenant_seen: dict[str, float] = {}
        self._exemplars = ExemplarMemory(self.window_ms, config.history_windows())
        self._links = AlertLinks(config.grafana_url, config.runbook_base_url, self.window_ms)
        #: The registered tenants, the only ones the silence rule watches (streams.core.tenancy): the writer
        #: shares its own ledger here (:meth:`use_tenants`); alone, the engine books the windows it evaluates.
        self.tenants = SteadyLedger.from_settings(settings)
        self._last_window: float | None = None
        #: (rule, outcome) -> evaluations since start, for metrics.
        self.outcomes: Counter[tuple[str, str]] = Counter()

    def use_tenants(self, tenants: SteadyLedger) -> None:
        """Watch the registered tenants of ``tenants`` (the writer's, booked as its windows close)."""
        self.tenants = tenants

    def restore(self, active: Iterable[AlertTransition]) -> int:
        """Resume pending/firing alerts known to the outbox (``DeliveryState.active_transitions``) after a
        restart, so they resolve when their condition is gone instead of being re-sent forever."""
        restored = 0
        for transition in active:
            key = self.alerts.restore(transition)
            if key is None:
                continue
            restored += 1
            self._series_seen[key] = max(self._series_seen.get(key, transition.window_start), transition.window_start)
            if key[0] == "TTFTTenantSilent" and key[1] not in self._tenant_seen:
                silent_for = self.config.tenant_silence.silent_windows * self.window_ms
                self._tenant_seen[key[1]] = (transition.fired_at or transition.active_at) - silent_for
        return restored

    def evaluate(
        self, window_start_ms: float, windows: WindowSnapshot, *, muted: bool = False
    ) -> list[AlertTransition]:
        """Transitions caused by the window starting at ``window_start_ms`` (see :meth:`evaluate_window`)."""
        return self.evaluate_window(window_start_ms, windows, muted=muted).transitions

    def evaluate_window(
        self, window_start_ms: float, windows: WindowSnapshot, *, muted: bool = False
    ) -> WindowEvaluation:
        """Evaluate every rule on a closed window: transitions, canary verdict rows and outcomes.

        ``muted`` (replay/backfill) marks the transitions so the delivery loop stores but never pages them.
        """
        now = float(window_start_ms)
        out = WindowEvaluation(now)
        if self._last_window is not None and now <= self._last_window:
            return out
        self._last_window = now
        facts = window_facts(windows)
        self._exemplars.observe(now, windows.tail_attribution, windows.arms)
        degraded = self._telemetry(now, facts, out)
        self._record(now, windows, facts, degraded)
        self._regression(now, windows, degraded, out)
        self._canary(now, windows, degraded, out)
        self._undecidable_alerts(now, out)
        self._draft(now, windows, out)
        self._slo(now, out)
        self._silence(now, facts, out)
        if self.config.watchdog:
            out.transitions += self.alerts.fire_now(
                ("Watchdog", "", "", ""),
                now,
                severity="none",
                summary="The TTFT alerting pipeline is alive",
                description="Always firing while rules are evaluated; its absence means alerting is broken.",
            )
        self._sweep_stale(now, out)
        out.transitions = [self._annotate(t) for t in out.transitions]
        if muted:
            out.transitions = [replace(t, muted=True) for t in out.transitions]
        for e in out.evaluations:
            self.outcomes[(e.rule, e.outcome)] += 1
        return out

    # --- recording ------------------------------------------------------------------------------

    def _record(self, now: float, snap: WindowSnapshot, facts: WindowFacts, degraded: set[str]) -> None:
        # Arms are compared only over windows where the canary had traffic, so the (long) arm history is
        # kept only for tenants with canary traffic in this window: memory follows live canaries.
        canary_tenants = {
            str(r["tenant_id"])
            for r in snap.stage_windows
            if snap.arms.get((r["tenant_id"], r["version_id"])) == "canary"
        }
        per_stage: dict[tuple[str, str], list[LatencySketch]] = defaultdict(list)
        for row in snap.stage_windows:
            tenant, version, stage = str(row["tenant_id"]), str(row["version_id"]), str(row["stage"])
            arm = snap.arms.get((tenant, version))
            sketch = sketch_of_row(row, self._accuracy)
            if stage in self._tracked_stages and arm != "canary":
                per_stage[(tenant, stage)].append(sketch)
            if arm is not None and tenant in canary_tenants and stage in self.config.canary.stages:
                self._arms.add((tenant, version, stage), now, sketch)
        for key, parts in per_stage.items():
            self._stages.add(key, now, (merge_sketches(parts, self._accuracy), key[0] in degraded))
        strata: dict[tuple[str, str, str], dict[str, LatencySketch]] = defaultdict(dict)
        canary_stages = self.config.canary.stages
        for row in snap.stage_strata:
            tenant, version, stage = str(row["tenant_id"]), str(row["version_id"]), str(row["stage"])
            if snap.arms.get((tenant, version)) is not None and tenant in canary_tenants and stage in canary_stages:
                cell = strata[(tenant, version, stage)]
                sketch = sketch_of_row(row, self._accuracy)
                name = stratum_of(row)
                cell[name] = merge_sketches([cell[name], sketch], self._accuracy) if name in cell else sketch
        for cell_key, cells in strata.items():
            self._strata.add(cell_key, now, cells)
        for tenant, t in facts.tenants.items():
            self._burn.add(tenant, now, (t.slo_bad, t.slo_requests))

    # --- rules ----------------------------------------------------------------------------------

    def _telemetry(self, now: float, facts: WindowFacts, out: WindowEvaluation) -> set[str]:
        rule = self.config.telemetry
        degraded: set[str] = set()
        if not rule.enabled:
            return degraded
        for tenant, t in sorted(facts.tenants.items()):
            completeness = t.completeness
            if completeness is None or t.total < rule.min_requests:
                continue
            key: AlertKey = ("TTFTTelemetryDegraded", tenant, "", "")
            bad = completeness < rule.completeness_floor
            if bad:
                degraded.add(tenant)
            self._note(out, key, "breach" if bad else "ok")
            out.transitions += self.alerts.step(
                key,
                "breach" if bad else "clear",
                now,
                severity="ticket",
                resolve_windows=rule.resolve_windows,
                summary=f"Telemetry of tenant {tenant} is incomplete"
                + (f": {t.no_first_chunk} LLM calls without a first chunk" if t.no_first_chunk else ""),
                description=t.describe(tenant, rule.completeness_floor),
                numbers=t.numbers(),
            )
        return degraded

    def _regression(self, now: float, snap: WindowSnapshot, degraded: set[str], out: WindowEvaluation) -> None:
        rule = self.config.stage_regression
        if not rule.enabled:
            return
        present = sorted(
            {
                (str(r["tenant_id"]), str(r["stage"]))
                for r in snap.stage_windows
                if r["stage"] in rule.stages and snap.arms.get((r["tenant_id"], r["version_id"])) != "canary"
            }
        )
        for tenant, stage in present:
            key: AlertKey = ("TTFTStageRegression", tenant, stage, "")
            check = check_stage(
                self._stages,
                self._baselines,
                rule,
                tenant,
                stage,
                now,
                self.window_ms,
                self._floor(tenant, stage),
                tenant in degraded,
                self._accuracy,
            )
            self._note(out, key, check.outcome, check.span_windows, check.samples)
            if check.signal == "hold" and check.numbers is None:
                continue
            steps = self.alerts.step(
                key,
                check.signal,
                now,
                severity=check.severity,
                for_windows=rule.for_windows,
                resolve_windows=rule.resolve_windows,
                summary=f"{stage} P95 regressed for tenant {tenant}",
                description=check.description,
                numbers=check.numbers or {},
            )
            self._incidents.observe(tenant, stage, steps)
            out.transitions += steps

    def _canary(self, now: float, snap: WindowSnapshot, degraded: set[str], out: WindowEvaluation) -> None:
        rule = self.config.canary
        if not rule.enabled:
            return
        stable, canaries = _arm_versions(snap)
        for tenant, version in canaries:
            failing: list[str] = []
            for stage in rule.stages:
                verdict, critical = evaluate_canary(
                    self._arms,
                    self._strata,
                    rule,
                    tenant=tenant,
                    stage=stage,
                    canary_version=version,
                    stable_versions=tuple(sorted(stable[tenant])),
                    now=now,
                    window_ms=self.window_ms,
                    floor_ms=self._floor(tenant, stage),
                    slo_ms=self.settings.slo_ms(tenant) if stage == "ttft" else None,
                    degraded=tenant in degraded,
                    accuracy=self._accuracy,
                )
                out.verdicts.append(verdict)
                description = verdict.explanation
                if verdict.verdict == "fail" and stage != "ttft":
                    failing.append(f"{stage} x{verdict.ratio or 0.0:.2f}")
                elif verdict.verdict == "fail" and failing:
                    description += " Failing stages of the same canary: " + ", ".join(failing) + "."
                key: AlertKey = ("TTFTCanaryFailed", tenant, stage, version)
                samples = min(verdict.n_canary, verdict.n_stable)
                self._note(out, key, _VERDICT_OUTCOME[verdict.verdict], verdict.span_windows, samples)
                signal = self._canary_signal(key, verdict.verdict)
                if signal == "hold":
                    continue
                out.transitions += self.alerts.step(
                    key,
                    signal,
                    now,
                    severity="page",
                    for_windows=rule.for_windows,
                    immediate=critical,
                    summary=f"Canary {version} fails on {stage} for tenant {tenant}",
                    description=description,
                    numbers=verdict.numbers(),
                )

    def _canary_signal(self, key: AlertKey, verdict: str) -> Signal:
        if verdict == "fail":
            return "breach"
        tracked = self.alerts.get(key)
        if verdict == "pass" and (tracked is None or tracked.state == "pending"):
            return "clear"  # a firing canary stays failed until its traffic stops
        return "hold"

    def _draft(self, now: float, snap: WindowSnapshot, out: WindowEvaluation) -> None:
        rule = self.config.draft_acceptance
        if not rule.enabled:
            return
        for row in sorted(snap.llm_signals, key=lambda r: (str(r["tenant_id"]), str(r["version_id"]))):
            tenant, version = str(row["tenant_id"]), str(row["version_id"])
            key: AlertKey = ("TTFTDraftAcceptanceLow", tenant, "llm_ttft", version)
            check = check_draft(row, rule)
            self._note(out, key, check.outcome)
            if check.outcome in ("inconclusive", "insufficient_traffic"):
                continue
            out.transitions += self.alerts.step(
                key,
                check.signal,
                now,
                severity="ticket",
                for_windows=rule.for_windows,
                summary=f"Draft acceptance of version {version} is low for tenant {tenant}",
                description=check.description,
                numbers=check.numbers,
            )

    def _slo(self, now: float, out: WindowEvaluation) -> None:
        rule = self.config.slo_burn
        if not rule.enabled:
            return
        for tenant in sorted(self._burn.keys()):
            key: AlertKey = ("TTFTSLOBurn", tenant, "ttft", "")
            check = check_burn(
                self._burn,
                rule,
                tenant,
                now,
                self.window_ms,
                self.settings.slo_ms(tenant),
                self.settings.slo_target(tenant),
            )
            self._note(out, key, check.outcome)
            if check.signal == "hold":
                continue
            move = self._moved_stage(tenant, now) if check.signal == "breach" else None
            out.transitions += self.alerts.step(
                key,
                check.signal,
                now,
                severity=check.severity,
                summary=f"Tenant {tenant} burns its TTFT SLO" + (f"; {move.stage} moved most" if move else ""),
                description=check.description + (move.describe() if move else ""),
                numbers={**(check.numbers or {}), **(move.numbers() if move else {})},
                annotations={MOVED_STAGE: move.stage} if move else None,
            )

    def _moved_stage(self, tenant: str, now: float) -> StageMove | None:
        """The parent stage whose P95 rose most over its baseline, else the one tail attribution blames."""
        rule = self.config.stage_regression
        shifts = {
            stage: stage_shift(self._stages, self._baselines, rule, tenant, stage, now, self.window_ms, self._accuracy)
            for stage in rule.stages
        }
        tail, band = tail_shares(self._exemplars.latest(tenant))
        return moved_stage(shifts, tail, band)

    def _annotate(self, transition: AlertTransition) -> AlertTransition:
        """Links (board, runbook) and example requests of the tenant's slowest tail (stable arm for a stage
        regression, the alert's version for a version's alert)."""
        tenant, version = transition.labels.get("tenant", ""), transition.labels.get("version", "")
        if tenant and transition.state != "resolved" and transition.alertname in _LATENCY_ALERTS:
            ids = self._exemplars.pick(tenant, version, stable_only=transition.alertname == "TTFTStageRegression")
            if ids:
                examples = {**transition.annotations, EXEMPLARS: orjson.dumps(ids).decode()}
                transition = replace(transition, annotations=examples)
        return self._links.annotate(transition)

    def _silence(self, now: float, facts: WindowFacts, out: WindowEvaluation) -> None:
        rule = self.config.tenant_silence
        if not rule.enabled:
            return
        tenants = self.tenants
        seen = [tenant for tenant, t in facts.tenants.items() if t.requests > 0]
        tenants.observe(int(now // self.window_ms), seen)  # booked already when shared with the writer
        registered = tenants.registered
        for tenant, t in facts.tenants.items():
            if t.requests > 0 and tenant in registered:
                self._tenant_seen[tenant] = now

        def note(key: AlertKey, outcome: Outcome) -> None:
            self._note(out, key, outcome)

        out.transitions += silence_steps(rule, self._tenant_seen, self.alerts, now, self.window_ms, note, registered)

    # --- bookkeeping ----------------------------------------------------------------------------

    def _undecidable_alerts(self, now: float, out: WindowEvaluation) -> None:
        if not self.config.undecidable.enabled:
            return
        out.transitions += self._undecidable.step(self.alerts, now, lambda key, o, span: self._note(out, key, o, span))

    def _note(self, out: WindowEvaluation, key: AlertKey, outcome: Outcome, span: int = 1, samples: int = 0) -> None:
        now = out.window_start
        self._series_seen[key] = now
        if outcome in DECIDED_OUTCOMES:
            self._last_decided[key] = now
        evaluation = RuleEvaluation(
            key[0], key[1], key[2], key[3], outcome, now, span, samples, self._last_decided.get(key)
        )
        self._undecidable.observe(evaluation)
        out.evaluations.append(evaluation)

    def _sweep_stale(self, now: float, out: WindowEvaluation) -> None:
        """Resolve alerts whose series stopped reporting (rolled-back canary, vanished tenant) and prune."""
        horizon = now - self.config.stale_windows * self.window_ms
        for key, _ in list(self.alerts.active()):
            if key[0] in _NOT_SERIES:
                continue
            if self._series_seen.get(key, now) <= horizon:
                out.transitions.append(
                    self.alerts.resolve(key, now, f"no data for {self.config.stale_windows} windows: resolved")
                )
        self._incidents.prune(lambda tenant, stage: self.alerts.get(("TTFTStageRegression", tenant, stage, "")))
        for key in [k for k, seen in self._series_seen.items() if seen <= horizon]:
            del self._series_seen[key]
            self._last_decided.pop(key, None)
        for history in (self._stages, self._arms, self._strata, self._burn):
            history.prune(now)
        self._exemplars.prune(now)
        self._baselines.prune(now)
        self._undecidable.prune(now)

    def _floor(self, tenant: str, stage: str) -> float:
        override = self.settings.tenants.get(tenant)
        if override is not None and stage in override.stage_floor_ms:
            return override.stage_floor_ms[stage]
        return self.config.stage_floor_ms.get(stage, 0.0)


def _arm_versions(snap: WindowSnapshot) -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """Stable versions per tenant, and the (tenant, canary version) pairs with rows in this window."""
    stable: dict[str, set[str]] = defaultdict(set)
    for (tenant, version), arm in snap.arms.items():
        if arm == "stable":
            stable[tenant].add(version)
    canaries = {
        (str(r["tenant_id"]), str(r["version_id"]))
        for r in snap.stage_windows
        if snap.arms.get((r["tenant_id"], r["version_id"])) == "canary"
    }
    return stable, sorted(canaries)
