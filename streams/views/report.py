"""``ttft report``: one HTML page (``index.html``) with PNG charts and ``report.json`` beside it.

The page opens with a one-paragraph verdict (what to cut first and why), then: P95 per stage over time,
the breakdown, tail attribution, the canary comparison, the alert timeline and completeness. Every number
comes from the stored aggregates through :mod:`streams.views.reads` (percentiles from merged bins), and
``report.json`` holds exactly the numbers the page prints, so tests can compare them with SQL. Works on
the embedded store and on a server (same client).

What to cut first comes from ``ttft whatif --rank`` over the span's stored requests
(:func:`streams.core.whatif_rank.rank_stages`): each stage 20 % faster, replayed request by request,
ranked by the change in TTFT's P95, not by the largest stage P95 (stage P95s do not add up). A caller
may add lines of its own below the verdict (``story_lines``: the demo's fixes, each predicted before it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from streams.core.stages import TTFT
from streams.core.whatif import WhatIfRefused
from streams.core.whatif_rank import Ranking, rank_stages
from streams.settings import PARENT_STAGES, Settings
from streams.views import reads
from streams.views.breakdown import Breakdown, breakdown_from_rows
from streams.views.canary import CanaryComparison, compare_arms, version_arms
from streams.views.span import Span
from streams.views.summary import fmt_ms, fmt_share, ok_attributions, stage_stats, sum_health

#: At most this many points per time series: longer spans merge consecutive windows into buckets.
MAX_POINTS = 120
Step = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class AlertSpan:
    """One alert episode (pending -> firing -> resolved), event time in epoch ms."""

    fingerprint: str
    alertname: str
    tenant: str
    stage: str
    version: str
    severity: str
    active_at: float
    fired_at: float | None
    resolved_at: float | None
    muted: bool
    summary: str

    @property
    def label(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in (("stage", self.stage), ("version", self.version)) if v)
        return f"{self.alertname} {self.tenant} {extra}".strip()


def alert_spans(rows: Sequence[dict[str, Any]], span: Span) -> list[AlertSpan]:
    """Fold alert transitions into episodes (one per fingerprint x ``active_at``) overlapping the span."""
    episodes: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        episodes[(str(row["fingerprint"]), float(row["active_at"]))].append(row)
    out = []
    for (fp, active_at), steps in episodes.items():
        fired = [float(s["fired_at"]) for s in steps if s.get("fired_at") is not None]
        resolved = [float(s["resolved_at"]) for s in steps if s.get("resolved_at") is not None]
        last = steps[-1]
        episode = AlertSpan(
            fingerprint=fp,
            alertname=str(last["alertname"]),
            tenant=str(last["tenant_id"]),
            stage=str(last["stage"]),
            version=str(last["version_id"]),
            severity=str(last["severity"]),
            active_at=active_at,
            fired_at=min(fired) if fired else None,
            resolved_at=max(resolved) if resolved else None,
            muted=bool(last.get("muted")),
            summary=str(dict(last.get("annotations") or {}).get("summary", "")),
        )
        if episode.active_at < span.end_ms and (episode.resolved_at is None or episode.resolved_at >= span.start_ms):
            out.append(episode)
    return sorted(out, key=lambda a: (a.active_at, a.label))


@dataclass
class TenantReport:
    """Everything the report shows for one tenant."""

    breakdown: Breakdown
    p95_series: list[dict[str, Any]] = field(default_factory=list)
    completeness_series: list[dict[str, Any]] = field(default_factory=list)
    canary: CanaryComparison | None = None
    #: The stages by their effect on TTFT's P95 (``ttft whatif --rank``); None without complete requests.
    ranking: Ranking | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "breakdown": self.breakdown.to_json(),
            "p95_series": self.p95_series,
            "completeness_series": self.completeness_series,
            "canary": None if self.canary is None else self.canary.to_json(),
            "rank": None if self.ranking is None else self.ranking.to_json(),
        }

    def cut_first(self) -> tuple[str, str]:
        """The stage to cut first and why: the replay's ranking, else the breakdown's stage-P95 advice."""
        ranking = self.ranking
        if ranking is None or not ranking.rows:
            return self.breakdown.cut_first, self.breakdown.reason
        first = ranking.rows[0]
        reason = (
            f"20 % faster it takes {first.faster_gain:,.0f} ms off TTFT's P95, the most of any stage "
            f"(replayed request by request over {ranking.requests:,} complete requests)"
        )
        if len(ranking.rows) > 1:
            second = ranking.rows[1]
            reason += f"; then {second.stage} ({second.faster_gain:,.0f} ms)"
        return first.stage, reason


@dataclass
class ReportData:
    """The numbers of one report."""

    span: Span
    bucket_ms: int
    tenants: dict[str, TenantReport]
    alerts: list[AlertSpan]
    verdict: str = ""
    charts: list[str] = field(default_factory=list)
    #: Lines a caller adds below the verdict (the demo: each fix predicted on the phase before it).
    story: list[str] = field(default_factory=list)

    def time_range(self) -> tuple[float, float]:
        """The x range of the time charts: from the first data point or alert in the span to its end
        (a span reaching back before the first window would otherwise leave most charts empty)."""
        points = [float(p["window_start"]) for r in self.tenants.values() for p in r.p95_series]
        points += [a.active_at for a in self.alerts]
        first = max(self.span.start_ms, min(points)) if points else self.span.start_ms
        return first, float(self.span.end_ms)

    def to_json(self) -> dict[str, Any]:
        start, end = self.span.iso()
        return {
            "span": {
                "start_ms": self.span.start_ms,
                "end_ms": self.span.end_ms,
                "start": start,
                "end": end,
                "anchor": self.span.anchor,
            },
            "bucket_ms": self.bucket_ms,
            "verdict": self.verdict,
            "story": self.story,
            "tenants": {t: r.to_json() for t, r in self.tenants.items()},
            "alerts": [asdict(a) for a in self.alerts],
            "charts": self.charts,
        }


def bucket_for(span: Span, window_ms: int) -> int:
    """Bucket width for the time series: a whole number of windows, at most :data:`MAX_POINTS` points."""
    windows = max(1, math.ceil(span.duration_ms / window_ms))
    return window_ms * max(1, math.ceil(windows / MAX_POINTS))


def _series(rows: Sequence[dict[str, Any]], tenant: str) -> list[dict[str, Any]]:
    by_bucket: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["tenant_id"] == tenant:
            by_bucket[int(row["window_start"])].append(row)
    out = []
    for ws in sorted(by_bucket):
        stats = stage_stats(by_bucket[ws])
        out.append(
            {
                "window_start": ws,
                "p95": {s: st.p95 for s, st in stats.items()},
                "count": {s: st.count for s, st in stats.items()},
            }
        )
    return out


def _completeness_series(rows: Sequence[dict[str, Any]], tenant: str) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if row["tenant_id"] == tenant:
            c = sum_health([row])
            out.append({"window_start": int(row["window_start"]), **c.to_json()})
    return out


def collect_report(
    client: Client,
    database: str,
    settings: Settings,
    span: Span,
    tenants: Sequence[str] | None = None,
    step: Step = lambda _name: None,
) -> ReportData:
    """Read every number of the report for ``tenants`` (default: all tenants in the span)."""
    window_ms = settings.windows.window_s * 1000
    bucket = bucket_for(span, window_ms)
    names = list(tenants) if tenants else reads.tenants_in_span(client, database, span)
    step("time series")
    series_rows = reads.stage_rows(client, database, span, bucket_ms=bucket, by_version=False)
    health_series = reads.health_rows(client, database, span, bucket_ms=bucket)
    # Per window and version: the canary comparison keeps only windows where both arms had traffic.
    version_rows = reads.stage_rows(client, database, span, bucket_ms=window_ms)
    rollouts = reads.version_rollouts(client, database, span)
    verdicts = reads.canary_verdict_rows(client, database, span)
    out: dict[str, TenantReport] = {}
    for tenant in names:
        step(f"breakdown {tenant}")
        attributions = reads.attribution_rows(client, database, span, tenant)
        ids = [rid for r in ok_attributions(attributions) for rid in r.get("exemplar_request_ids") or ()]
        bd = breakdown_from_rows(
            tenant=tenant,
            version=None,
            span=span,
            slo_ms=settings.slo_ms(tenant),
            stage_rows=[r for r in series_rows if r["tenant_id"] == tenant],
            attribution_rows=attributions,
            health_rows=[r for r in health_series if r["tenant_id"] == tenant],
            signal_rows=reads.signal_rows(client, database, span, tenant),
            exemplar_ttft=reads.request_ttfts(client, database, ids, tenant),
        )
        arms = version_arms(tenant, rollouts, verdicts, settings.tenants.get(tenant), bd.versions)
        out[tenant] = TenantReport(
            breakdown=bd,
            p95_series=_series(series_rows, tenant),
            completeness_series=_completeness_series(health_series, tenant),
            canary=compare_arms(tenant, arms, version_rows, verdicts, window_ms) if arms else None,
            ranking=_ranking(client, database, span, tenant),
        )
    step("alerts")
    alerts = alert_spans(reads.alert_rows(client, database, span), span)
    if tenants:
        alerts = [a for a in alerts if a.tenant in names or not a.tenant]
    data = ReportData(span=span, bucket_ms=bucket, tenants=out, alerts=alerts)
    data.verdict = verdict_paragraph(data)
    return data


def _ranking(client: Client, database: str, span: Span, tenant: str) -> Ranking | None:
    try:
        return rank_stages(reads.request_columns(client, database, span, tenant))
    except WhatIfRefused:
        return None  # no complete request in the span: the breakdown's advice stands


def _canary_sentence(canary: CanaryComparison) -> str:
    known = {s: r for s in (*PARENT_STAGES, TTFT) if (r := canary.ratio(s)) is not None}
    if not known:
        return ""
    text = f"Canary {', '.join(canary.versions('canary'))} vs stable {', '.join(canary.versions('stable'))}: "
    changes = [f"TTFT P95 {known[TTFT] - 1:+.0%}"] if TTFT in known else []
    stages = [s for s in known if s != TTFT]
    if stages:
        moved = max(stages, key=lambda s: abs(known[s] - 1.0))
        changes.append(f"largest stage change {moved} {known[moved] - 1:+.0%}")
    text += ", ".join(changes) + f" ({canary.span_text()})"
    failed = [v for v in canary.verdicts if v.get("verdict") == "fail"]
    if failed:
        text += f"; the canary check failed on {', '.join(sorted({str(v['stage']) for v in failed}))}"
    return text + "."


def verdict_paragraph(data: ReportData) -> str:
    """The report's opening paragraph: per tenant, what to cut first and why, then the caveats."""
    sentences: list[str] = []
    for tenant, report in data.tenants.items():
        bd = report.breakdown
        if bd.ttft_p95 is None:
            sentences.append(f"{tenant}: no latency data in the span.")
            continue
        over = "above" if bd.ttft_p95 > bd.slo_ms else "within"
        text = f"{tenant}: TTFT P95 is {fmt_ms(bd.ttft_p95)}, {over} the {fmt_ms(bd.slo_ms)} SLO"
        if bd.slo_bad_share is not None:
            text += f" ({fmt_share(bd.slo_bad_share)} of requests SLO-bad)"
        cut_first, reason = report.cut_first()
        text += f". Cut {cut_first} first: {reason}." if cut_first else f". {reason}."
        if bd.parent_p95_sum is not None:
            text += (
                f" The parent stage P95s add up to {fmt_ms(bd.parent_p95_sum)}, not the true "
                f"{fmt_ms(bd.ttft_p95)}: stage P95s do not add up."
            )
        complete = bd.completeness.share("complete")
        if complete is not None and complete < 0.95:
            text += f" Caution: only {fmt_share(complete)} of records are complete."
        if report.canary is not None:
            text += " " + _canary_sentence(report.canary)
        sentences.append(text.strip())
    fired = sorted({a.alertname for a in data.alerts if a.fired_at is not None and a.alertname != "Watchdog"})
    if fired:
        sentences.append(f"Alerts fired in the span: {', '.join(fired)}.")
    return " ".join(sentences) if sentences else "No stage windows in the span."


def write_json(data: ReportData, path: Path) -> None:
    """``report.json``: the report's numbers."""
    path.write_bytes(orjson.dumps(data.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


CHART_FILES = (
    "p95_over_time.png",
    "breakdown.png",
    "tail_attribution.png",
    "canary.png",
    "alerts.png",
    "completeness.png",
)


def report_steps(tenant_count: int) -> int:
    """How many times :func:`build_report` calls ``step`` (for a progress bar)."""
    return 2 + tenant_count + len(CHART_FILES) + 1


def build_report(
    client: Client,
    database: str,
    settings: Settings,
    span: Span,
    out_dir: Path,
    *,
    tenants: Sequence[str] | None = None,
    step: Step = lambda _name: None,
    story_lines: Sequence[str] = (),
) -> ReportData:
    """Collect the numbers, draw the charts, write ``index.html`` and ``report.json`` into ``out_dir``.

    ``step(name)`` is called before each unit of work (:func:`report_steps` of them), for progress display.
    ``story_lines`` are printed below the verdict (and kept in ``report.json`` as ``story``).
    """
    # Imported here: matplotlib is slow to import and only the report needs it.
    from streams.views import report_charts as charts
    from streams.views.report_html import render_html

    out_dir.mkdir(parents=True, exist_ok=True)
    data = collect_report(client, database, settings, span, tenants, step)
    data.story = list(story_lines)
    slo = {t: settings.slo_ms(t) for t in data.tenants}
    xlim = data.time_range()
    reports = list(data.tenants.values())
    breakdowns = [r.breakdown for r in reports]
    draw: dict[str, Callable[[Path], None]] = {
        "p95_over_time.png": lambda p: charts.chart_p95_over_time(
            p, {t: r.p95_series for t, r in data.tenants.items()}, slo, data.bucket_ms, xlim
        ),
        "breakdown.png": lambda p: charts.chart_breakdown(p, breakdowns),
        "tail_attribution.png": lambda p: charts.chart_tail(p, breakdowns),
        "canary.png": lambda p: charts.chart_canary(p, [r.canary for r in reports if r.canary], slo),
        "alerts.png": lambda p: charts.chart_alerts(p, data.alerts, *xlim),
        "completeness.png": lambda p: charts.chart_completeness(
            p, {t: r.completeness_series for t, r in data.tenants.items()}, data.bucket_ms, xlim
        ),
    }
    for name in CHART_FILES:
        step(f"chart {name}")
        draw[name](out_dir / name)
        data.charts.append(name)
    step("index.html")
    (out_dir / "index.html").write_text(render_html(data), encoding="utf-8")
    write_json(data, out_dir / "report.json")
    return data
