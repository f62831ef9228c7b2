"""``ttft whatif``: the replay's answer for people (rich tables); the numbers come from :mod:`streams.core.whatif`.

The request columns are read by :func:`streams.views.reads.request_columns`; ``--json`` prints the core's
``to_json`` as it is, so this module only words and lays out what the core computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from schemas.vocabulary import SUB_STAGES
from streams.core.whatif import LeverReport, WhatIf
from streams.core.whatif_levers import AllCacheHits, CachedShare, Cap, Cut, ParallelRecall, RouteAll, RouteShare, Scale
from streams.core.whatif_rank import Ranking
from streams.views.span import Span
from streams.views.summary import fmt_ms

#: Below this many requests a P95 rests on a handful of them: the output says so.
FEW_REQUESTS = 200
#: Console width from which ``--rank`` shows the interval, the naive estimate and the cap's value.
WIDE = 110


@dataclass(frozen=True, slots=True)
class Scope:
    """Which requests were replayed: tenant, version and route (``None``: all), and the span."""

    tenant: str | None
    version: str | None
    route: str | None
    span: Span

    def title(self, what: str) -> Text:
        parts = [
            self.tenant if self.tenant is not None else "all tenants",
            f"version {self.version}" if self.version else "all versions",
            f"route {self.route}" if self.route else "all routes",
        ]
        return Text(f"{what} · {' · '.join(parts)}", style="bold")

    def span_line(self) -> str:
        start, end = self.span.iso()
        if self.span.anchor == "absolute":
            return f"span {start} → {end}"
        anchored = "the newest stored window" if self.span.anchor == "data" else "the wall clock"
        return f"span {start} → {end} (relative times anchored on {anchored})"


def _donors(report: LeverReport) -> str:
    buckets = report.detail.get("buckets", {})
    return ", ".join(f"{name} {b['donors']:,}" for name, b in buckets.items()) or "-"


def describe_lever(report: LeverReport) -> str:
    """One line on what a lever did to the replayed requests."""
    lever, n = report.lever, report.changed
    if isinstance(lever, Scale):
        return f"{lever.stage} x{lever.factor:g} on {n:,} requests"
    if isinstance(lever, Cut):
        return f"{lever.stage} {lever.ms:,.0f} ms shorter (floored at 0) on {n:,} requests"
    if isinstance(lever, Cap):
        own = f" (its own P{lever.percentile:g})" if lever.percentile is not None else ""
        return f"{lever.stage} capped at {report.detail['cap_ms']:,.0f} ms{own}: {n:,} requests were longer"
    if isinstance(lever, ParallelRecall):
        return f"{n:,} requests recalled serially: retrieval shorter by their shorter recall leg"
    if isinstance(lever, AllCacheHits):
        kept = report.detail.get("not_cacheable", 0)
        below = f"; {kept:,} misses below the cacheable prompt size kept" if kept else ""
        if "buckets" not in report.detail:  # --cached-share follows: it gives these their llm_ttft
            return f"{n:,} prompt-cache misses become hits (their llm_ttft from --cached-share){below}"
        return (
            f"{n:,} prompt-cache misses took the llm_ttft of a hit with a prompt of their size "
            f"(donors by prompt size: {_donors(report)}){below}"
        )
    if isinstance(lever, CachedShare):
        d = report.detail
        return (
            f"{n:,} prompt-cache hits cache {lever.share:.0%} of their prompt (stored hits: {d['stored_share']:.0%}): "
            f"llm_ttft along {d['base_ms']:,.0f} ms + {d['ms_per_1k_uncached']:,.1f} ms per 1k uncached tokens"
        )
    if isinstance(lever, RouteShare):
        already = report.detail.get("already", 0)
        return (
            f"{n:,} requests moved onto route {lever.route} ({already:,} were on it already), their llm_ttft "
            f"x{lever.factor:g}"
        )
    assert isinstance(lever, RouteAll)
    return (
        f"{n:,} requests off route {lever.route} took the llm_ttft of one on it with a prompt of their size "
        f"(donors by prompt size: {_donors(report)})"
    )


def _pct(change: float, base: float) -> str:
    return f"{change / base:+.1%}" if base else "-"


def render_whatif(console: Console, scope: Scope, result: WhatIf, resamples: int) -> None:
    """The levers, then observed and predicted TTFT percentiles, the P95's interval and the naive estimate."""
    console.rule(scope.title("What if"))
    console.print(
        f"{scope.span_line()}; {result.requests:,} complete requests replayed; levers in order:", highlight=False
    )
    for index, report in enumerate(result.levers, 1):
        console.print(f"  {index}. {report.lever.text}: {describe_lever(report)}", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("TTFT", "observed", "predicted", "change", "95 % CI", "naive"):
        table.add_column(name, justify="left" if name == "TTFT" else "right", no_wrap=True)
    lo, hi = result.p95_ci
    for name in result.observed:
        observed, predicted = result.observed[name], result.predicted[name]
        is_p95 = name == "p95"
        table.add_row(
            name.upper(),
            fmt_ms(observed),
            fmt_ms(predicted),
            _pct(predicted - observed, observed),
            f"{lo:,.0f}-{hi:,.0f} ms" if is_p95 else "",
            fmt_ms(result.naive_p95) if is_p95 else "",
            style="bold" if is_p95 else "",
        )
    console.print(table)
    observed, predicted, naive = result.observed["p95"], result.predicted["p95"], result.naive_p95
    console.print(
        f"→ TTFT P95 {fmt_ms(observed)} → {fmt_ms(predicted)} ({_pct(predicted - observed, observed)}; 95 % "
        f"bootstrap interval over {resamples} resamples of the requests). Naive: observed P95 minus the change "
        f"in each stage's own P95 says {fmt_ms(naive)}, {naive - predicted:+,.0f} ms from the replay.",
        highlight=False,
    )
    if result.requests < FEW_REQUESTS:
        console.print(f"[yellow]only {result.requests} requests: the P95 rests on a handful of them[/]")


def render_rank(console: Console, scope: Scope, ranking: Ranking) -> None:
    """Every stage's effect on TTFT P95, 20 % faster and capped at its own P50, largest gain first. A narrow
    console drops the interval, the naive estimate and the cap's value; the ranking itself never wraps."""
    console.rule(scope.title("What to cut first"))
    observed = ranking.observed["p95"]
    console.print(
        f"{scope.span_line()}; {ranking.requests:,} complete requests replayed; TTFT P95 {fmt_ms(observed)}",
        highlight=False,
    )
    wide = console.width >= WIDE
    table = Table(
        title="TTFT P95 with each stage 20 % faster, and with it capped at its own P50",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    columns = ["stage", "stage P95", "-20 %", *(["95 % CI", "naive"] if wide else []), "change"]
    columns += ["cap (P50)", "capped", "change"] if wide else ["capped", "change"]
    for name in columns:
        table.add_column(name, justify="left" if name == "stage" else "right", no_wrap=True)
    for row in ranking.rows:
        sub = row.stage in SUB_STAGES
        cells = [f"└ {row.stage}" if sub else row.stage, fmt_ms(row.stage_p95), fmt_ms(row.faster_p95)]
        if wide:
            cells += [f"{row.faster_ci[0]:,.0f}-{row.faster_ci[1]:,.0f}", fmt_ms(row.faster_naive_p95)]
        cells.append(f"{-row.faster_gain:+,.0f} ms")
        cells += [fmt_ms(row.cap_ms)] if wide else []
        cells += [fmt_ms(row.capped_p95), f"{-row.capped_gain:+,.0f} ms"]
        table.add_row(*cells, style="" if sub else "bold")
    console.print(table)
    if ranking.rows:
        first = ranking.rows[0]
        console.print(
            Text.assemble(
                ("→ cut ", "bold green"),
                (first.stage, "bold green"),
                (" first: ", "bold green"),
                f"20 % off it takes {first.faster_gain:,.0f} ms off TTFT's P95, the most of any stage "
                "(sub-stages count through retrieval's critical path)",
            )
        )
    if ranking.requests < FEW_REQUESTS:
        console.print(f"[yellow]only {ranking.requests} requests: the P95 rests on a handful of them[/]")
