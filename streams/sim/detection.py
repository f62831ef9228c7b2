"""Detection time as a function of traffic: the shipped rules swept over per-tenant request rates.

Pure and deterministic (seeded numpy, no clock, no I/O but the optional docs write): the rule engine with
the default :class:`RulesConfig` (equal to ``deploy/config/ttft.yaml``) is fed windows from
:mod:`streams.sim.rule_windows`. Three runs per rate, each over three tenants with a 25 % canary arm:

- ``regression``: 90 stable windows, then tenant ``t2``'s retrieval x1.5 (both arms) for 25 windows, then
  recovery. Detection time = the firing window's start minus the first regressed window's start.
- ``stable``: 180 windows (3 hours) without any change.
- ``canary``: canaries from their first window, at 5 % and 25 % share, one with llm_ttft x1.35 and one
  identical to stable. Time to verdict = the first window whose llm_ttft verdict is not
  ``insufficient_traffic``, counted from the canary's first window.

``python -m streams.sim.detection --write docs/detection.md`` rewrites the table in that file; a unit test
renders it again and fails when the committed table differs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from streams.rules import AlertTransition, RuleEngine, RulesConfig, WindowEvaluation
from streams.rules.model import Arm
from streams.settings import Settings, WindowConfig
from streams.sim.rule_windows import WINDOW_MS, ArmTraffic, WindowSource

RATES: tuple[float, ...] = (0.5, 2.0, 6.0, 20.0, 100.0)
TENANTS: tuple[str, ...] = ("t1", "t2", "t3")
CANARY_SHARE = 0.25
REGRESSED_TENANT = "t2"
WARMUP_WINDOWS = 90
REGRESSION_WINDOWS = 25
RECOVERY_WINDOWS = 45
STABLE_WINDOWS = 180
CANARY_WINDOWS = 66
CANARY_SHARES: tuple[float, ...] = (0.05, 0.25)
BEGIN, END = "<!-- detection-table:begin -->", "<!-- detection-table:end -->"

Traffic = Mapping[tuple[str, str], ArmTraffic]


@dataclass
class RunResult:
    """What one run produced: every transition with its window index, and the evaluations kept."""

    transitions: list[tuple[int, AlertTransition]] = field(default_factory=list)
    evaluations: list[WindowEvaluation] = field(default_factory=list)

    def firing(self, alertname: str | None = None) -> list[tuple[int, AlertTransition]]:
        """Firing transitions (of one alert name, or of TTFTStageRegression and TTFTCanaryFailed)."""
        names = {alertname} if alertname else {"TTFTStageRegression", "TTFTCanaryFailed"}
        return [(i, t) for i, t in self.transitions if t.state == "firing" and t.alertname in names]


def make_engine() -> RuleEngine:
    """The engine with the shipped rules and SLO (2 s), as a fresh deployment has it."""
    # Every field the engine reads is given here, so no TTFT_* variable or config file can change the table.
    settings = Settings(default_slo_ms=2_000.0, default_slo_target=0.99, tenants={}, windows=WindowConfig())
    return RuleEngine(RulesConfig(), settings)


def run(seed: int, windows: int, arms: Mapping[tuple[str, str], Arm], traffic: Callable[[int], Traffic]) -> RunResult:
    """Feed ``windows`` windows to a fresh engine; ``traffic(i)`` gives each window's arms."""
    source, engine, result = WindowSource(seed, arms), make_engine(), RunResult()
    for i in range(windows):
        ws, snap = source.window(i, traffic(i))
        evaluation = engine.evaluate_window(ws, snap)
        result.transitions += [(i, t) for t in evaluation.transitions]
        evaluation.verdicts = [v for v in evaluation.verdicts if v.stage == "llm_ttft"]
        result.evaluations.append(evaluation)
    return result


def _three_tenants(rate: float, factors: Callable[[str], Mapping[str, float]]) -> Traffic:
    out: dict[tuple[str, str], ArmTraffic] = {}
    for t in TENANTS:
        out[(t, "v1")] = ArmTraffic(rate * (1 - CANARY_SHARE), factors(t))
        out[(t, "v2")] = ArmTraffic(rate * CANARY_SHARE, factors(t))
    return out


_ARM_OF: dict[str, Arm] = {"v1": "stable", "v2": "canary"}
_ARMS: dict[tuple[str, str], Arm] = {(t, v): arm for t in TENANTS for v, arm in _ARM_OF.items()}


def regression_run(rate: float, seed: int = 12) -> RunResult:
    """Tenant t2's retrieval x1.5 from window ``WARMUP_WINDOWS`` for ``REGRESSION_WINDOWS`` windows."""
    first, stop = WARMUP_WINDOWS, WARMUP_WINDOWS + REGRESSION_WINDOWS

    def traffic(i: int) -> Traffic:
        slow = {"retrieval": 1.5} if first <= i < stop else {}
        return _three_tenants(rate, lambda t: slow if t == REGRESSED_TENANT else {})

    return run(seed, stop + RECOVERY_WINDOWS, _ARMS, traffic)


def stable_run(rate: float, seed: int = 13) -> RunResult:
    """Three hours of unchanged traffic."""
    return run(seed, STABLE_WINDOWS, _ARMS, lambda i: _three_tenants(rate, lambda t: {}))


def canary_tenant(share: float, slower: bool) -> str:
    """Tenant name of a canary run's arm pair, e.g. ``slow-25`` or ``same-5``."""
    return f"{'slow' if slower else 'same'}-{round(share * 100)}"


def canary_run(rate: float, seed: int = 14) -> RunResult:
    """Canaries at each share, llm_ttft x1.35 and identical, from window 0."""
    arms: dict[tuple[str, str], Arm] = {}
    traffic: dict[tuple[str, str], ArmTraffic] = {}
    for share in CANARY_SHARES:
        for slower in (True, False):
            tenant = canary_tenant(share, slower)
            arms[(tenant, "v1")], arms[(tenant, "v2")] = "stable", "canary"
            traffic[(tenant, "v1")] = ArmTraffic(rate * (1 - share), {})
            traffic[(tenant, "v2")] = ArmTraffic(rate * share, {"llm_ttft": 1.35} if slower else {})
    return run(seed, CANARY_WINDOWS, arms, lambda i: traffic)


@dataclass(frozen=True)
class RateFigures:
    """The table's row for one rate (minutes of event time; ``None``: never within the run)."""

    rate: float
    span_windows: int
    detected_min: float | None
    resolved_min: float | None
    verdict_min: dict[float, float | None]
    fail_min: dict[float, float | None]


def regression_figures(result: RunResult) -> tuple[float | None, float | None, int]:
    """Detection and resolution (minutes after the change) of t2's retrieval, and the span it used."""
    key = (REGRESSED_TENANT, "retrieval")
    fired = [i for i, t in result.firing("TTFTStageRegression") if (t.labels["tenant"], t.labels["stage"]) == key]
    resolved = [
        i
        for i, t in result.transitions
        if t.alertname == "TTFTStageRegression" and t.state == "resolved" and t.fired_at is not None
    ]
    detected = float(fired[0] - WARMUP_WINDOWS) if fired else None
    recovered = float(resolved[0] - WARMUP_WINDOWS - REGRESSION_WINDOWS) if resolved else None
    spans = [
        e.span_windows
        for e in result.evaluations[WARMUP_WINDOWS - 1].evaluations
        if e.rule == "TTFTStageRegression" and (e.tenant, e.stage) == key
    ]
    return detected, recovered, spans[0] if spans else 0


def canary_figures(result: RunResult, share: float) -> tuple[float | None, float | None]:
    """Minutes (from the canary's first window, counting that window) to the identical canary's first
    llm_ttft verdict, and to the x1.35 canary's TTFTCanaryFailed firing."""
    same = canary_tenant(share, slower=False)
    first = next(
        (
            i
            for i, ev in enumerate(result.evaluations)
            for v in ev.verdicts
            if v.tenant_id == same and v.verdict in ("pass", "fail")
        ),
        None,
    )
    slow = canary_tenant(share, slower=True)
    fired = [i for i, t in result.firing("TTFTCanaryFailed") if t.labels["tenant"] == slow]
    return (None if first is None else first + 1.0), (float(fired[0] + 1) if fired else None)


def sweep(rates: tuple[float, ...] = RATES) -> dict[float, tuple[RunResult, RunResult, RunResult]]:
    """The three runs per rate: (regression, stable, canary)."""
    return {rate: (regression_run(rate), stable_run(rate), canary_run(rate)) for rate in rates}


def figures(runs: Mapping[float, tuple[RunResult, RunResult, RunResult]]) -> list[RateFigures]:
    """The table's rows."""
    rows = []
    for rate, (reg, _, canary) in sorted(runs.items()):
        detected, resolved, span = regression_figures(reg)
        per_share = {share: canary_figures(canary, share) for share in CANARY_SHARES}
        rows.append(
            RateFigures(
                rate,
                span,
                detected,
                resolved,
                {s: f[0] for s, f in per_share.items()},
                {s: f[1] for s, f in per_share.items()},
            )
        )
    return rows


def _minutes(value: float | None, limit: int) -> str:
    return f"{value:.0f} min" if value is not None else f"none in {limit} min (insufficient_traffic)"


def render(rows: list[RateFigures]) -> str:
    """The markdown table (between the markers of the docs file)."""
    head = (
        "| requests/s per tenant | regression span (windows) | x1.5 retrieval regression fires after | "
        "resolves after recovery | canary 25 %: verdict after | canary 25 %: +35 % llm_ttft fires after | "
        "canary 5 %: verdict after | canary 5 %: +35 % llm_ttft fires after |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        lines.append(
            f"| {r.rate:g} | {r.span_windows} | {_minutes(r.detected_min, REGRESSION_WINDOWS)} | "
            f"{_minutes(r.resolved_min, RECOVERY_WINDOWS)} | {_minutes(r.verdict_min[0.25], CANARY_WINDOWS)} | "
            f"{_minutes(r.fail_min[0.25], CANARY_WINDOWS)} | {_minutes(r.verdict_min[0.05], CANARY_WINDOWS)} | "
            f"{_minutes(r.fail_min[0.05], CANARY_WINDOWS)} |"
        )
    return head + "\n".join(lines) + "\n"


def replace_table(doc: str, table: str) -> str:
    """``doc`` with the text between the markers replaced by ``table``."""
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{table}{END}{after}"


def main(argv: list[str] | None = None) -> int:
    """Print the table, or write it into ``--write FILE`` between the markers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", type=Path, default=None, help="docs file holding the table markers")
    args = parser.parse_args(argv)
    table = render(figures(sweep()))
    if args.write is None:
        sys.stdout.write(table)
        return 0
    args.write.write_text(replace_table(args.write.read_text(), table))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["RATES", "WINDOW_MS", "figures", "main", "render", "replace_table", "sweep"]
