"""The HTML page of ``ttft report``: one self-contained ``index.html`` referring to the PNGs beside it."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from typing import Final

from streams.core.stages import TTFT
from streams.views.breakdown import Breakdown, sum_vs_true
from streams.views.canary import CanaryComparison
from streams.views.report import AlertSpan, ReportData, TenantReport
from streams.views.summary import fmt_ms, fmt_share

CHARTS: Final = (
    (
        "p95_over_time.png",
        "P95 per stage over time",
        "Each point merges the sketches of its windows (and versions); the dashed line is the tenant's SLO.",
    ),
    (
        "breakdown.png",
        "Breakdown",
        "Stage P95s over the whole span, with the true end-to-end TTFT P95, the sum of "
        "the parent stage P95s (they differ) and the SLO.",
    ),
    (
        "tail_attribution.png",
        "Tail attribution",
        "Each stage's share of TTFT in typical requests (P40-P60) and "
        "in the slowest 5 %: a stage whose share grows is what makes slow requests slow.",
    ),
    (
        "canary.png",
        "Canary comparison",
        "P95 per stage of the canary arm beside the stable arm, over the windows where both had traffic.",
    ),
    ("alerts.png", "Alert timeline", "Pending and firing intervals of every alert in the span (event time)."),
    (
        "completeness.png",
        "Completeness",
        "Records that are not complete: their latencies are missing or partial.",
    ),
)

_CSS: Final = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1080px;margin:2em auto;
padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666}.verdict{background:#f4f8fb;border-left:4px solid #1f77b4;padding:.8em 1em;font-size:1.05em}
table{border-collapse:collapse;margin:.6em 0}
td,th{padding:.25em .8em;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left}tr.sub td:first-child{padding-left:2em;color:#666}
tr.ttft td{font-weight:bold;border-top:2px solid #999}img{max-width:100%;border:1px solid #eee}
.fail{color:#c00;font-weight:bold}.pass{color:#080}.insufficient_traffic{color:#a60}.note{color:#666;font-size:.9em}
"""


def _clock(ms: float | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000.0, UTC).strftime("%Y-%m-%d %H:%M")


def _stage_table(bd: Breakdown) -> str:
    rows = []
    for s in [*bd.stages, *([bd.ttft] if bd.ttft else [])]:
        name = "TTFT (end to end)" if s.stage == TTFT else s.stage
        rows.append(
            f'<tr class="{s.kind}"><td>{escape(name)}</td><td>{fmt_ms(s.p50)}</td><td>{fmt_ms(s.p95)}</td>'
            f"<td>{fmt_ms(s.p99)}</td><td>{s.count:,}</td></tr>"
        )
    return (
        "<table><tr><th>stage</th><th>P50</th><th>P95</th><th>P99</th><th>count</th></tr>" + "".join(rows) + "</table>"
    )


def _tenant_section(report: TenantReport) -> str:
    bd = report.breakdown
    c, t = bd.completeness, bd.tail
    cut_first, reason = report.cut_first()
    exemplars = ", ".join(escape(rid) + (f" ({fmt_ms(ms)})" if ms is not None else "") for rid, ms in t.exemplars)
    return (
        f"<h3>{escape(str(bd.tenant))}</h3>{_stage_table(bd)}"
        f"<p>{escape(sum_vs_true(bd))}</p>"
        f"<p><b>Cut {escape(cut_first or '-')} first</b>: {escape(reason)}</p>"
        f"<p>Biggest P95 stage <b>{escape(t.biggest_p95_stage or '-')}</b>, tail-dominant stage "
        f"<b>{escape(t.tail_dominant_stage or '-')}</b>. Slowest requests: {exemplars or '-'}.</p>"
        f"<p>Completeness: {c.total:,} records, {fmt_share(c.share('complete'))} complete, "
        f"{fmt_share(c.share('missing_stage'))} missing a stage, "
        f"{fmt_share(c.share('no_first_chunk'))} without a first chunk in their telemetry, "
        f"{fmt_share(c.share('timed_out'))} timed out, "
        f"{fmt_share(c.share('orphan'))} orphans; {c.late_events:,} late events, {c.late_amendments:,} late "
        f"amendments, {c.dead_letters:,} dead letters. Prompt-cache hit rate "
        f"{fmt_share(bd.signals.prompt_cache_hit_rate)}.</p>"
    )


def _canary_table(comp: CanaryComparison) -> str:
    rows = []
    for stage, canary in comp.stages.get("canary", {}).items():
        stable = comp.stages.get("stable", {}).get(stage)
        ratio = comp.ratio(stage)
        rows.append(
            f"<tr><td>{escape(stage)}</td><td>{fmt_ms(stable.p95 if stable else None)}</td>"
            f"<td>{fmt_ms(canary.p95)}</td><td>{'-' if ratio is None else f'{ratio - 1:+.1%}'}</td>"
            f"<td>{stable.count if stable else 0:,} / {canary.count:,}</td></tr>"
        )
    verdicts = "".join(
        f'<li><span class="{escape(str(v["verdict"]))}">{escape(str(v["verdict"]))}</span> '
        f"{escape(str(v['stage']))} {escape(str(v['canary_version']))}: "
        f"{escape(str(v.get('explanation', '')))}</li>"
        for v in comp.verdicts
    )
    return (
        f"<h3>{escape(comp.tenant)}: canary {escape(', '.join(comp.versions('canary')))} vs stable "
        f"{escape(', '.join(comp.versions('stable')))}</h3>"
        f"<p>Compared {escape(comp.span_text())}.</p>"
        "<table><tr><th>stage</th><th>stable P95</th><th>canary P95</th><th>change</th>"
        "<th>n stable / canary</th>"
        "</tr>" + "".join(rows) + "</table>" + (f"<ul>{verdicts}</ul>" if verdicts else "")
    )


def _alert_table(alerts: list[AlertSpan]) -> str:
    if not alerts:
        return "<p>No alerts in the span.</p>"
    rows = "".join(
        f"<tr><td>{escape(a.label)}</td><td>{escape(a.severity)}</td><td>{_clock(a.active_at)}</td>"
        f"<td>{_clock(a.fired_at)}</td><td>{_clock(a.resolved_at) if a.resolved_at else 'open'}</td>"
        f"<td>{escape(a.summary)}{' (muted)' if a.muted else ''}</td></tr>"
        for a in alerts
    )
    return (
        "<table><tr><th>alert</th><th>severity</th><th>pending</th><th>fired</th><th>resolved</th>"
        "<th>summary</th></tr>" + rows + "</table>"
    )


def render_html(data: ReportData) -> str:
    """The whole page."""
    start, end = data.span.iso()
    charts = {name: (title, caption) for name, title, caption in CHARTS}
    body = [
        "<h1>TTFT report</h1>",
        f'<p class="meta">{escape(start)} → {escape(end)} · '
        f"tenants {escape(', '.join(data.tenants) or '-')} · "
        f"generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}</p>",
        f'<p class="verdict">{escape(data.verdict)}</p>',
    ]
    if data.story:
        items = "".join(f"<li>{escape(line)}</li>" for line in data.story)
        body.append(f"<h2>The fixes, each predicted before it landed</h2><ul>{items}</ul>")

    def figure(name: str) -> str:
        title, caption = charts[name]
        return (
            f'<h2>{escape(title)}</h2><p class="note">{escape(caption)}</p><img src="{name}" alt="{escape(title)}">'
            if name in data.charts
            else ""
        )

    body.append(figure("p95_over_time.png"))
    body.append(figure("breakdown.png"))
    body.extend(_tenant_section(r) for r in data.tenants.values())
    body.append(figure("tail_attribution.png"))
    body.append(figure("canary.png"))
    comparisons = [r.canary for r in data.tenants.values() if r.canary is not None]
    body.extend(_canary_table(c) for c in comparisons)
    if not comparisons:
        body.append("<p>No canary traffic in the span.</p>")
    body.append(figure("alerts.png"))
    body.append(_alert_table(data.alerts))
    body.append(figure("completeness.png"))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>TTFT report</title>'
        f"<style>{_CSS}</style></head><body>" + "\n".join(b for b in body if b) + "</body></html>\n"
    )
