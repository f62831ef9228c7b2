"""The demo's conclusions, read from the store after the writer has exited (chDB: one process per dir).

:func:`collect_results` folds the stored aggregates of each story phase with the same code as
``ttft breakdown`` (:func:`streams.views.breakdown.compute_breakdown`, all tenants merged), finds the
canary alerts in the ``alerts`` table and writes the report with ``ttft report``'s
:func:`streams.views.report.build_report`. :func:`render_results` prints the verdict lines the demo
promises; :func:`story_problems` says which promise the data did not keep.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from clickhouse_connect.driver.client import Client
from rich.console import Console
from rich.table import Table

from streams.demo.plan import WINDOW_MS, DemoPlan, StoryPhase
from streams.demo.view import clock
from streams.settings import PARENT_STAGES, Settings
from streams.views import reads
from streams.views.breakdown import Breakdown, compute_breakdown, render_breakdown
from streams.views.report import build_report
from streams.views.span import Span
from streams.views.summary import fmt_ms

SEED_BEFORE_P95_MS: Final = 3_200.0
BEFORE_TOLERANCE: Final = 0.10
CANARY_ALERTS: Final = ("TTFTCanaryFailed", "TTFTDraftAcceptanceLow")
BEFORE: Final = ("seed-story", "before")
AFTER: Final = ("seed-story", "routing-speculative")


@dataclass(frozen=True, slots=True)
class FiredAlert:
    """One alert episode that reached ``firing`` (event times in epoch ms)."""

    alertname: str
    labels: str
    fired_at: float
    summary: str


@dataclass
class DemoResults:
    """What the demo concludes."""

    phases: list[tuple[StoryPhase, Breakdown]]
    fired: list[FiredAlert]
    paged: list[str]
    report_dir: Path
    verdict: str
    silent_windows: int = 0

    def breakdown(self, scenario: str, name: str) -> Breakdown | None:
        for phase, bd in self.phases:
            if (phase.scenario, phase.name) == (scenario, name):
                return bd
        return None

    @property
    def canary_alerts(self) -> list[FiredAlert]:
        return [a for a in self.fired if a.alertname in CANARY_ALERTS]


def _fired_alerts(rows: list[dict[str, Any]]) -> list[FiredAlert]:
    first: dict[str, FiredAlert] = {}
    for row in rows:
        fired_at = row.get("fired_at")
        if row.get("state") != "firing" or fired_at is None or row.get("muted"):
            continue
        labels = dict(row.get("labels") or {})
        identity = " ".join(f"{k}={labels[k]}" for k in ("tenant", "stage", "version", "severity") if labels.get(k))
        alert = FiredAlert(
            alertname=str(row["alertname"]),
            labels=identity,
            fired_at=float(fired_at),
            summary=str(dict(row.get("annotations") or {}).get("summary", "")),
        )
        key = f"{alert.alertname} {identity}"
        if key not in first or alert.fired_at < first[key].fired_at:
            first[key] = alert
    return sorted(first.values(), key=lambda a: (a.fired_at, a.alertname, a.labels))


def collect_results(
    client: Client, settings: Settings, plan: DemoPlan, report_dir: Path, paged: list[str], now_ms: float
) -> DemoResults:
    """Breakdowns per phase, fired alerts (up to ``now_ms``: some fire after the story) and the report."""
    db = settings.clickhouse_database
    phases = [
        (ph, compute_breakdown(client, db, settings, Span(ph.start_ms, ph.end_ms, "demo story")))
        for ph in plan.phases()
    ]
    story = Span(plan.start_ms, plan.end_ms, "demo story")
    fired = _fired_alerts(reads.alert_rows(client, db, Span(plan.start_ms, int(now_ms) + WINDOW_MS, "demo run")))
    data = build_report(client, db, settings, story, report_dir)
    return DemoResults(
        phases=phases,
        fired=fired,
        paged=paged,
        report_dir=report_dir,
        verdict=data.verdict,
        silent_windows=settings.rules.tenant_silence.silent_windows,
    )


def _parents_by_p95(bd: Breakdown) -> list[tuple[str, float]]:
    values = [(s.stage, s.p95) for s in bd.stages if s.stage in PARENT_STAGES and s.p95 is not None]
    return sorted(((k, v) for k, v in values if v is not None), key=lambda kv: -kv[1])


def story_problems(results: DemoResults) -> list[str]:
    """The promises the stored data did not keep (empty when the story came out as told)."""
    problems = []
    before = results.breakdown(*BEFORE)
    after = results.breakdown(*AFTER)
    if before is None or before.ttft_p95 is None:
        problems.append("no stored windows for the seed-story 'before' phase")
    else:
        order = [stage for stage, _ in _parents_by_p95(before)]
        if order[:2] != ["llm_ttft", "retrieval"]:
            problems.append(f"the 'before' breakdown orders the stages {order}, not llm_ttft then retrieval")
        if abs(before.ttft_p95 / SEED_BEFORE_P95_MS - 1.0) > BEFORE_TOLERANCE:
            problems.append(f"the 'before' TTFT P95 {before.ttft_p95:.0f} ms is not within 10 % of 3.2 s")
    if after is None or after.ttft_p95 is None:
        problems.append("no stored windows for the seed-story 'routing-speculative' phase")
    if not results.canary_alerts:
        problems.append(f"no canary alert ({' / '.join(CANARY_ALERTS)}) fired")
    if not (results.report_dir / "index.html").is_file():
        problems.append(f"no report in {results.report_dir}")
    return problems


def _story_table(results: DemoResults) -> Table:
    table = Table(title="The story, phase by phase (all tenants; P95 in ms)", title_justify="left")
    for name in ("phase", "event time", "requests", "retrieval", "prompt_assemble", "llm_ttft", "sum", "TTFT"):
        table.add_column(name, justify="left" if name in ("phase", "event time") else "right")
    for ph, bd in results.phases:
        p95 = bd.stage_p95
        table.add_row(
            ph.label,
            f"{clock(ph.start_ms)}-{clock(ph.end_ms)}",
            f"{bd.completeness.total:,}",
            *(fmt_ms(p95.get(s)) for s in PARENT_STAGES),
            fmt_ms(bd.parent_p95_sum),
            fmt_ms(bd.ttft_p95),
        )
    return table


def render_results(console: Console, results: DemoResults) -> None:
    """The breakdown of the 'before' phase, the story table and the verdict lines."""
    before = results.breakdown(*BEFORE)
    after = results.breakdown(*AFTER)
    if before is not None:
        render_breakdown(console, before)
    console.print(_story_table(results))

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    if before is not None and before.ttft_p95 is not None:
        ranked = _parents_by_p95(before)
        say(
            "breakdown (before): "
            + ", ".join(f"{stage} {value:,.0f} ms" for stage, value in ranked)
            + f" -> cut {ranked[0][0]} first, then {ranked[1][0]}"
        )
        off = before.ttft_p95 / SEED_BEFORE_P95_MS - 1.0
        within = "within" if abs(off) <= BEFORE_TOLERANCE else "NOT within"
        say(f"before: TTFT P95 {before.ttft_p95:,.0f} ms (the seed's 3.2 s {off:+.1%}: {within} 10 %)")
    if after is not None and after.ttft_p95 is not None and after.parent_p95_sum is not None:
        parts = " + ".join(f"{s} {v:,.0f}" for s, v in _parents_by_p95(after))
        diff = after.parent_p95_sum - after.ttft_p95
        say(
            f"after: TTFT P95 {after.ttft_p95:,.0f} ms beside the sum of stage P95s {after.parent_p95_sum:,.0f} ms "
            f"({parts}): they differ by {diff:+,.0f} ms. P95s do not add up (the slowest requests of one stage "
            "are mostly not the slowest of another), so the seed's '1.1 s' cannot follow from its stage numbers."
        )
    for alert in results.fired:
        if alert.alertname in CANARY_ALERTS:
            say(
                f"alert fired: {alert.alertname} {alert.labels} at {clock(alert.fired_at)} event time"
                + (f": {alert.summary}" if alert.summary else "")
            )
    others = Counter(a.alertname for a in results.fired if a.alertname not in CANARY_ALERTS)
    if others:
        names = ", ".join(f"{name} x{count}" if count > 1 else name for name, count in sorted(others.items()))
        say(f"also fired: {names}")
    if "TTFTTenantSilent" in others:
        say(
            "  TTFTTenantSilent: the story's traffic stopped, and the pipeline took long enough to drain that the "
            f"tenants had been silent for {results.silent_windows} windows (a slow or busy machine)"
        )
    if results.paged:
        by_name = Counter(entry.split(" ", 1)[0] for entry in results.paged)
        names = ", ".join(f"{name} x{count}" if count > 1 else name for name, count in sorted(by_name.items()))
        say(f"alertmanager paged {len(results.paged)} firing alert(s) to the demo's webhook: {names}")
    say(f"report written to {results.report_dir / 'index.html'} (it opens with the verdict)")
