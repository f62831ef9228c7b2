"""``ttft breakdown``: where a tenant's TTFT goes over a span, and which stage to cut first.

:func:`compute_breakdown` reads the stored aggregates (:mod:`streams.views.reads`) and folds them with the
pure :func:`breakdown_from_rows`; :func:`render_breakdown` prints it with rich. The same :class:`Breakdown`
feeds ``ttft report`` and its ``report.json``.

The sum of the parent stage P95s is shown beside the true end-to-end TTFT P95 on purpose: percentiles do
not add up, because the slowest requests of one stage are mostly not the slowest of another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from streams.core.attribution import advice
from streams.core.stages import OTHER, TTFT
from streams.settings import PARENT_STAGES, Settings
from streams.views import reads
from streams.views.span import Span
from streams.views.summary import (
    Completeness,
    LlmSignals,
    StageStat,
    TailSummary,
    combine_attribution,
    fmt_ms,
    fmt_share,
    ok_attributions,
    ordered_stages,
    parent_p95_sum,
    stage_stats,
    sum_health,
    sum_signals,
)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """One tenant's (or all tenants') stage breakdown over a span."""

    tenant: str | None
    version: str | None
    span: Span
    versions: list[str]
    stages: list[StageStat]
    ttft: StageStat | None
    parent_p95_sum: float | None
    slo_ms: float
    tail: TailSummary
    completeness: Completeness
    signals: LlmSignals
    cut_first: str
    reason: str
    windows: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def stage_p95(self) -> dict[str, float | None]:
        """P95 (ms) of every stage in the table."""
        return {s.stage: s.p95 for s in self.stages}

    @property
    def ttft_p95(self) -> float | None:
        return self.ttft.p95 if self.ttft is not None else None

    @property
    def slo_bad_share(self) -> float | None:
        """Share of the records (timed-out and orphan ones included; ``no_first_chunk`` ones, whose TTFT is
        unknown, left out) that missed the SLO."""
        if self.ttft is None or not self.completeness.slo_total:
            return None
        return self.ttft.slo_bad_count / self.completeness.slo_total

    def to_json(self) -> dict[str, Any]:
        """The numbers the view prints, JSON-ready (``ttft breakdown --json`` and ``report.json``)."""
        start, end = self.span.iso()
        return {
            "tenant": self.tenant,
            "version": self.version,
            "versions": self.versions,
            "span": {
                "start_ms": self.span.start_ms,
                "end_ms": self.span.end_ms,
                "start": start,
                "end": end,
                "anchor": self.span.anchor,
            },
            "windows": self.windows,
            "stages": [s.to_json() for s in self.stages],
            "ttft": None if self.ttft is None else self.ttft.to_json(),
            "ttft_p95": self.ttft_p95,
            "parent_p95_sum": self.parent_p95_sum,
            "slo_ms": self.slo_ms,
            "slo_bad_share": self.slo_bad_share,
            "tail_attribution": self.tail.to_json(),
            "completeness": self.completeness.to_json(),
            "llm_signals": self.signals.to_json(),
            "cut_first": self.cut_first,
            "reason": self.reason,
            "notes": self.notes,
        }


def breakdown_from_rows(
    *,
    tenant: str | None,
    version: str | None,
    span: Span,
    slo_ms: float,
    stage_rows: Sequence[Mapping[str, Any]],
    attribution_rows: Sequence[Mapping[str, Any]],
    health_rows: Sequence[Mapping[str, Any]],
    signal_rows: Sequence[Mapping[str, Any]],
    exemplar_ttft: Mapping[str, float | None] | None = None,
) -> Breakdown:
    """Fold stored rows of one span into a :class:`Breakdown` (pure)."""
    stats = stage_stats(stage_rows)
    table = ordered_stages(stats)
    ttft = stats.get(TTFT)
    p95 = {s: stats[s].p95 for s in PARENT_STAGES if s in stats}
    cut_first, reason = advice(p95, ok_attributions(attribution_rows))
    notes: list[str] = []
    if OTHER in stats and stats[OTHER].negative_count:
        notes.append(
            f"{stats[OTHER].negative_count} requests had a negative unattributed gap (stage spans overlap "
            "or clocks disagree); clamped to 0 in the sketch"
        )
    return Breakdown(
        tenant=tenant,
        version=version,
        span=span,
        versions=sorted({str(r["version_id"]) for r in signal_rows}),
        stages=table,
        ttft=ttft,
        parent_p95_sum=parent_p95_sum(stats),
        slo_ms=slo_ms,
        tail=combine_attribution(attribution_rows, p95, exemplar_ttft),
        completeness=sum_health(health_rows),
        signals=sum_signals(signal_rows),
        cut_first=cut_first,
        reason=reason,
        windows=len({int(r["window_start"]) for r in attribution_rows}),
        notes=notes,
    )


def compute_breakdown(
    client: Client,
    database: str,
    settings: Settings,
    span: Span,
    *,
    tenant: str | None = None,
    version: str | None = None,
) -> Breakdown:
    """Read the span's aggregates for ``tenant`` (all when ``None``) and ``version`` (all versions merged
    when ``None``) and fold them. The SLO is the tenant's (``settings.slo_ms``), the default for all."""
    attributions = reads.attribution_rows(client, database, span, tenant, version)
    exemplar_ids = [rid for r in ok_attributions(attributions) for rid in r.get("exemplar_request_ids") or ()]
    return breakdown_from_rows(
        tenant=tenant,
        version=version,
        span=span,
        slo_ms=settings.slo_ms(tenant) if tenant is not None else settings.default_slo_ms,
        stage_rows=reads.stage_rows(client, database, span, tenant, version, by_version=False),
        attribution_rows=attributions,
        health_rows=reads.health_rows(client, database, span, tenant, version),
        signal_rows=reads.signal_rows(client, database, span, tenant, version),
        exemplar_ttft=reads.request_ttfts(client, database, exemplar_ids, tenant),
    )


# --- rendering ------------------------------------------------------------------------------------------


def sum_vs_true(bd: Breakdown) -> str:
    """The sentence that puts the sum of stage P95s beside the true TTFT P95."""
    total, true = bd.parent_p95_sum, bd.ttft_p95
    if total is None or true is None:
        return "not enough data to compare the sum of stage P95s with the TTFT P95"
    parts = " + ".join(f"{s.stage} {s.p95:,.0f}" for s in bd.stages if s.kind == "parent" and s.p95)
    diff = total - true
    return (
        f"sum of parent stage P95s {total:,.0f} ms ({parts}) vs true TTFT P95 {true:,.0f} ms: they differ by "
        f"{diff:+,.0f} ms ({diff / true:+.1%}). P95s do not add up: the slowest requests of one stage are "
        "mostly not the slowest of another, so cutting a stage's P95 by X ms cuts the TTFT P95 by less."
    )


def _stage_table(bd: Breakdown, width: int) -> Table:
    scale = max([s.p95 or 0.0 for s in bd.stages] + [bd.ttft_p95 or 0.0]) or 1.0
    # Numbers never wrap: a narrow console drops the max column, and the bars take what is left.
    show_max = width >= 100
    bar_width = max(4, min(24, width - (82 if show_max else 70)))
    table = Table(
        title="Stage P95 (largest first; sub-stages are parts of their parent)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    columns = ["stage", "P50", "P95", "P99", *(["max"] if show_max else []), "count", ""]
    for name in columns:
        table.add_column(name, justify="left" if name in ("stage", "") else "right", no_wrap=True)
    for s in [*bd.stages, *([bd.ttft] if bd.ttft else [])]:
        label = f"  └ {s.stage}" if s.kind == "sub" else s.stage
        style = "bold" if s.kind in ("parent", "ttft") else ("dim" if s.kind == "sub" else "")
        bar = "█" * max(1, round(bar_width * (s.p95 or 0.0) / scale)) if s.p95 else ""
        if s.kind == "ttft":
            table.add_section()
            label = "TTFT (true)"
        cells = [label, fmt_ms(s.p50), fmt_ms(s.p95), fmt_ms(s.p99)]
        cells += [fmt_ms(s.max)] if show_max else []
        table.add_row(*cells, f"{s.count:,}", bar, style=style)
    return table


def _tail_table(tail: TailSummary) -> Table:
    table = Table(title="Tail attribution: share of TTFT", title_justify="left")
    for name in ("stage", "typical (P40-P60)", "slowest 5 %", "change"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    for stage in (*PARENT_STAGES, OTHER):
        if stage in tail.tail_share:
            table.add_row(
                stage,
                fmt_share(tail.band_share.get(stage)),
                fmt_share(tail.tail_share[stage]),
                fmt_share(tail.share_delta.get(stage), signed=True),
            )
    return table


def render_breakdown(console: Console, bd: Breakdown) -> None:
    """Print a breakdown: stage table, sum-vs-true, tail attribution, completeness, signals, advice."""
    start, end = bd.span.iso()
    who = bd.tenant if bd.tenant is not None else "all tenants"
    versions = bd.version or f"all versions ({', '.join(bd.versions) or '-'})"
    console.rule(Text(f"TTFT breakdown · {who} · {versions}", style="bold"))
    console.print(
        f"span {start} → {end} ({bd.windows} windows; relative times anchored on "
        f"{'the newest stored data' if bd.span.anchor == 'data' else bd.span.anchor})",
        highlight=False,
    )
    if bd.ttft is None and not bd.stages:
        console.print("[yellow]no stage windows in this span[/]")
        return
    console.print(_stage_table(bd, console.width))
    slo = bd.slo_bad_share
    console.print(
        f"TTFT P95 [bold]{fmt_ms(bd.ttft_p95)}[/] vs SLO {fmt_ms(bd.slo_ms)}"
        + (f": {fmt_share(slo)} of requests SLO-bad (timed-out and orphan ones included)" if slo is not None else ""),
        highlight=False,
    )
    console.print(sum_vs_true(bd), highlight=False)
    tail = bd.tail
    if tail.windows_ok:
        console.print(_tail_table(tail))
        exemplars = ", ".join(f"{rid} ({fmt_ms(t)})" if t is not None else rid for rid, t in tail.exemplars)
        console.print(
            f"biggest P95 stage: [bold]{tail.biggest_p95_stage}[/]   tail-dominant stage (largest share "
            f"increase): [bold]{tail.tail_dominant_stage}[/]   ({tail.windows_ok} window x version rows "
            f"attributed, {tail.windows_insufficient} with too few requests)\n"
            f"slowest requests: {exemplars or '-'}",
            highlight=False,
        )
    else:
        console.print("tail attribution: insufficient data (needs ≥ 200 complete requests per window)")
    c = bd.completeness
    console.print(
        f"completeness: {c.total:,} records, complete {fmt_share(c.share('complete'))}, missing stage "
        f"{fmt_share(c.share('missing_stage'))}, no first chunk {fmt_share(c.share('no_first_chunk'))}, "
        f"timed out {fmt_share(c.share('timed_out'))}, orphan {fmt_share(c.share('orphan'))}; late events "
        f"{c.late_events:,}, late amendments {c.late_amendments:,}, dead letters {c.dead_letters:,}, "
        f"duplicates {c.duplicate_events:,}"
        + (f", [red]series cap tripped {c.overflow_series}×[/]" if c.overflow_series else ""),
        highlight=False,
    )
    sig = bd.signals
    draft = ", ".join(f"{v} P50 {p50:.2f}" for v, (p50, _p10, _ws) in sig.draft_accept.items() if p50 is not None)
    console.print(
        f"LLM signals: prompt-cache hit rate {fmt_share(sig.prompt_cache_hit_rate)}, "
        "prompts below the cacheable "
        f"minimum {fmt_share(sig.below_cacheable_share)}, draft acceptance {draft or '-'} (newest window)",
        highlight=False,
    )
    for note in bd.notes:
        console.print(f"[dim]note: {note}[/]")
    if bd.cut_first:
        console.print(
            Text.assemble(("→ cut ", "bold green"), (bd.cut_first, "bold green"), (" first: ", "bold green"), bd.reason)
        )
    else:
        console.print(f"→ no advice: {bd.reason}")
