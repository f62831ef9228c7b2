"""The demo's conclusions, read from the store after the writer has exited (chDB: one process per dir).

:func:`collect_results` folds the stored aggregates of each story phase with the same code as
``ttft breakdown`` (:func:`streams.views.breakdown.compute_breakdown`, all tenants merged), replays the
seed story's stored requests with ``ttft whatif``'s core (:mod:`streams.demo.story_whatif`: what to cut
first, ranked by the replay, and each fix predicted on the phase before it), finds the canary alerts in the
``alerts`` table and writes the report with ``ttft report``'s :func:`streams.views.report.build_report`.
:func:`render_results` prints the verdict lines the demo promises; :func:`story_problems` says which
promise the data did not keep.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from clickhouse_connect.driver.client import Client
from rich.console import Console
from rich.table import Table

from streams.core.whatif import WhatIfRefused
from streams.core.whatif_rank import Ranking, rank_stages
from streams.demo.plan import WINDOW_MS, DemoPlan, StoryPhase
from streams.demo.story_whatif import FixOutcome, predict_fixes
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


@dataclass(frozen=True, slots=True)
class TenantRow:
    """One tenant of the story: requests stored and their TTFT P95, and the way its traffic came in."""

    tenant: str
    requests: int
    ttft_p95: float | None
    way_in: str


EMITTER_WAY: Final = "stage events (emitter)"
OTEL_WAY: Final = "OpenTelemetry traces (OpenInference -> Collector -> otlp_spans)"


@dataclass
class DemoResults:
    """What the demo concludes."""

    phases: list[tuple[StoryPhase, Breakdown]]
    fired: list[FiredAlert]
    paged: list[str]
    report_dir: Path
    verdict: str
    silent_windows: int = 0
    #: No Alertmanager ran: the writer posted ``paged`` straight to the demo's webhook receiver.
    paged_directly: bool = False
    tenants: list[TenantRow] | None = None
    otel_tenant: str | None = None
    #: ``--otel``: the join's ``ttft_otlp_spans_total`` by outcome (stage, not_stage, dead_letter, replayed).
    otlp_spans: dict[str, float] | None = None
    #: The 'before' phase ranked by ``ttft whatif --rank``: all tenants (key ``None``), then each tenant.
    rankings: dict[str | None, Ranking] = field(default_factory=dict)
    #: Each fix of the seed story predicted on the phase before it, beside the phase after it.
    fixes: list[FixOutcome] = field(default_factory=list)

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
    client: Client,
    settings: Settings,
    plan: DemoPlan,
    report_dir: Path,
    paged: list[str],
    now_ms: float,
    *,
    otel_tenant: str | None = None,
    otlp_spans: dict[str, float] | None = None,
) -> DemoResults:
    """Breakdowns per phase, fired alerts (up to ``now_ms``: some fire after the story) and the report;
    with ``otel_tenant`` (``--otel``) also a row per tenant saying which way its traffic came in."""
    db = settings.clickhouse_database
    phases = [
        (ph, compute_breakdown(client, db, settings, Span(ph.start_ms, ph.end_ms, "demo story")))
        for ph in plan.phases()
    ]
    story = Span(plan.start_ms, plan.end_ms, "demo story")
    fired = _fired_alerts(reads.alert_rows(client, db, Span(plan.start_ms, int(now_ms) + WINDOW_MS, "demo run")))
    rankings, fixes = _story_whatif(client, db, plan)
    data = build_report(client, db, settings, story, report_dir, story_lines=[f.line() for f in fixes])
    tenants = None
    if otel_tenant is not None:
        records: Counter[str] = Counter()
        for row in reads.version_rollouts(client, db, story):
            records[str(row["tenant_id"])] += int(row["records"])
        tenants = [
            TenantRow(
                tenant,
                records.get(tenant, 0),
                compute_breakdown(client, db, settings, story, tenant=tenant).ttft_p95,
                OTEL_WAY if tenant == otel_tenant else EMITTER_WAY,
            )
            for tenant in plan.tenants
        ]
    return DemoResults(
        phases=phases,
        fired=fired,
        paged=paged,
        report_dir=report_dir,
        verdict=data.verdict,
        silent_windows=settings.rules.tenant_silence.silent_windows,
        tenants=tenants,
        otel_tenant=otel_tenant,
        otlp_spans=otlp_spans,
        rankings=rankings,
        fixes=fixes,
    )


def _story_whatif(client: Client, db: str, plan: DemoPlan) -> tuple[dict[str | None, Ranking], list[FixOutcome]]:
    """The seed story replayed: the 'before' phase ranked (all tenants, then each), and the fixes predicted."""
    seed_phases = {ph.name: ph for ph in plan.phases() if ph.scenario == BEFORE[0]}
    columns = {
        name: reads.request_columns(client, db, Span(ph.start_ms, ph.end_ms, "demo story"))
        for name, ph in seed_phases.items()
    }
    rankings: dict[str | None, Ranking] = {}
    before = seed_phases.get(BEFORE[1])
    if before is not None:
        span = Span(before.start_ms, before.end_ms, "demo story")
        for tenant in (None, *plan.tenants):
            selected = columns[before.name] if tenant is None else reads.request_columns(client, db, span, tenant)
            try:
                rankings[tenant] = rank_stages(selected)
            except WhatIfRefused:
                continue  # no complete request of that tenant in the phase: nothing to rank
    return rankings, predict_fixes(columns)


def _ranking_text(ranking: Ranking) -> str:
    rows = ", ".join(f"{row.stage} {-row.faster_gain:+,.0f} ms" for row in ranking.rows)
    text = f"{rows} (TTFT P95 {fmt_ms(ranking.observed['p95'])}, {ranking.requests:,} requests)"
    if len(ranking.rows) >= 2:
        text += f" -> cut {ranking.rows[0].stage} first, then {ranking.rows[1].stage}"
    return text


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
        ranked = results.rankings.get(None)
        order = [row.stage for row in ranked.rows] if ranked is not None else []
        if order[:2] != ["llm_ttft", "retrieval"]:
            problems.append(f"the 'before' phase replayed ranks the stages {order}, not llm_ttft then retrieval")
        if abs(before.ttft_p95 / SEED_BEFORE_P95_MS - 1.0) > BEFORE_TOLERANCE:
            problems.append(f"the 'before' TTFT P95 {before.ttft_p95:.0f} ms is not within 10 % of 3.2 s")
    if after is None or after.ttft_p95 is None:
        problems.append("no stored windows for the seed-story 'routing-speculative' phase")
    if not results.canary_alerts:
        problems.append(f"no canary alert ({' / '.join(CANARY_ALERTS)}) fired")
    if results.otel_tenant is not None:
        row = next((t for t in results.tenants or () if t.tenant == results.otel_tenant), None)
        if row is None or row.requests == 0:
            problems.append(f"no request of the OpenTelemetry tenant {results.otel_tenant} was stored")
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


def _tenant_table(rows: list[TenantRow]) -> Table:
    table = Table(title="Tenants of the story, and how their traffic came in", title_justify="left")
    for name in ("tenant", "requests stored", "TTFT P95", "came in as"):
        table.add_column(name, justify="right" if name in ("requests stored", "TTFT P95") else "left")
    for row in rows:
        table.add_row(row.tenant, f"{row.requests:,}", fmt_ms(row.ttft_p95), row.way_in)
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
        say(
            "breakdown (before): stage P95s "
            + ", ".join(f"{stage} {value:,.0f} ms" for stage, value in _parents_by_p95(before))
            + " (they do not say what a cut does to TTFT's P95: the replay below does)"
        )
        off = before.ttft_p95 / SEED_BEFORE_P95_MS - 1.0
        within = "within" if abs(off) <= BEFORE_TOLERANCE else "NOT within"
        say(f"before: TTFT P95 {before.ttft_p95:,.0f} ms (the seed's 3.2 s {off:+.1%}: {within} 10 %)")
    if results.rankings:
        say(
            "what to cut first: the 'before' requests replayed with each stage 20 % faster, by the change in TTFT's "
            "P95 (ttft whatif --rank)"
        )
    for tenant, ranking in results.rankings.items():
        say(f"what to cut first (before, {tenant or 'all tenants'}): {_ranking_text(ranking)}")
    for outcome in results.fixes:
        say(outcome.line())
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
        if results.paged_directly:
            say(f"no Alertmanager: {len(results.paged)} firing alert(s) went straight to the demo's webhook: {names}")
        else:
            say(f"alertmanager paged {len(results.paged)} firing alert(s) to the demo's webhook: {names}")
    if results.tenants:
        console.print(_tenant_table(results.tenants))
        for row in results.tenants:
            if row.tenant == results.otel_tenant:
                say(
                    f"tenant {row.tenant}: {row.requests:,} requests stored (TTFT P95 {fmt_ms(row.ttft_p95)}), "
                    f"came in as {row.way_in}"
                )
    if results.otlp_spans is not None and results.otel_tenant is not None:
        spans = results.otlp_spans
        say(
            f"otlp spans of {results.otel_tenant}: {spans.get('stage', 0):,.0f} stage, "
            f"{spans.get('not_stage', 0):,.0f} not stages, {spans.get('dead_letter', 0):,.0f} dead-lettered, "
            f"{spans.get('replayed', 0):,.0f} replayed (the join's ttft_otlp_spans_total)"
        )
    say(f"report written to {results.report_dir / 'index.html'} (it opens with the verdict)")
