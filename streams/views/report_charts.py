"""The PNG charts of ``ttft report`` (matplotlib, object API on the Agg canvas: no pyplot global state).

Each function takes the report's numbers and writes one PNG; every chart has a title, milliseconds on
its latency axis, a legend, and the tenant's SLO where it applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import matplotlib

matplotlib.use("Agg")  # before any other matplotlib import: the report never needs a display

import matplotlib.dates as mdates
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, PercentFormatter

from streams.core.stages import OTHER, TTFT
from streams.settings import PARENT_STAGES
from streams.views.breakdown import Breakdown
from streams.views.canary import CanaryComparison

COLORS: Final = {
    "retrieval": "#1f77b4",
    "vector_recall": "#6baed6",
    "bm25_recall": "#9ecae1",
    "rerank": "#c6dbef",
    "prompt_assemble": "#ff7f0e",
    "llm_ttft": "#9467bd",
    OTHER: "#8c8c8c",
    TTFT: "#111111",
}
STATUS_COLORS: Final = {
    "missing_stage": "#f2c14e",
    "no_first_chunk": "#8c8c8c",
    "timed_out": "#d62728",
    "orphan": "#9467bd",
}
SLO_COLOR: Final = "#d62728"
DPI: Final = 110
_MS = FuncFormatter(lambda v, _pos: f"{v:,.0f} ms")


def _time(ms: float) -> float:
    """Epoch milliseconds as a matplotlib date number (the typed way to put times on an axis)."""
    return float(mdates.date2num(datetime.fromtimestamp(ms / 1000.0, UTC)))  # type: ignore[no-untyped-call]


def _figure(rows: int, height: float = 3.0, width: float = 10.0) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width, max(2.6, height * rows)), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, 1, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, list(axes)


def _empty(path: Path, title: str, message: str) -> None:
    fig = Figure(figsize=(10, 1.8), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(title, loc="left", fontweight="bold")
    ax.text(0.5, 0.4, message, ha="center", va="center", fontsize=12, color="#555555", transform=ax.transAxes)
    fig.savefig(path)


def _time_axis(ax: Axes, xlim: tuple[float, float] | None = None) -> None:
    if xlim is not None:
        ax.set_xlim(_time(xlim[0]), _time(xlim[1]))
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))  # type: ignore[no-untyped-call]
    ax.set_xlabel("event time (UTC)")


def chart_p95_over_time(
    path: Path,
    series: dict[str, list[dict[str, Any]]],
    slo_ms: dict[str, float],
    bucket_ms: int,
    xlim: tuple[float, float] | None = None,
) -> None:
    """P95 per parent stage and end-to-end TTFT per time bucket, one panel per tenant, SLO line."""
    tenants = [t for t, s in series.items() if s]
    if not tenants:
        _empty(path, "P95 per stage over time", "no stage windows in the span")
        return
    fig, axes = _figure(len(tenants), height=3.2)
    for ax, tenant in zip(axes, tenants, strict=True):
        points = series[tenant]
        times = [_time(p["window_start"] + bucket_ms / 2) for p in points]  # bucket midpoints
        for stage in (TTFT, *PARENT_STAGES):
            values = [p["p95"].get(stage) for p in points]
            if any(v is not None for v in values):
                ax.plot(
                    times,
                    [float("nan") if v is None else v for v in values],
                    color=COLORS[stage],
                    lw=2.4 if stage == TTFT else 1.6,
                    label="TTFT (end to end)" if stage == TTFT else stage,
                    marker="o" if len(points) < 30 else None,
                    ms=3,
                )
        ax.axhline(slo_ms[tenant], color=SLO_COLOR, ls="--", lw=1.2, label=f"TTFT SLO {slo_ms[tenant]:,.0f} ms")
        ax.set_title(f"{tenant}: P95 per {bucket_ms // 1000} s bucket (merged sketches)", loc="left")
        ax.yaxis.set_major_formatter(_MS)
        ax.set_ylim(bottom=0)
        _time_axis(ax, xlim)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.suptitle("P95 per stage over time", fontweight="bold", x=0.01, ha="left")
    fig.savefig(path)


def chart_breakdown(path: Path, breakdowns: Sequence[Breakdown]) -> None:
    """Stage P95 bars (sub-stages lighter, under retrieval), then the parents' P95s stacked beside the true
    TTFT P95: the two bottom bars differ, which is the point."""
    usable = [b for b in breakdowns if b.stages]
    if not usable:
        _empty(path, "Stage breakdown", "no stage windows in the span")
        return
    fig, axes = _figure(len(usable), height=0.36 * (max(len(b.stages) for b in usable) + 2) + 1.2)
    for ax, bd in zip(axes, usable, strict=True):
        n = len(bd.stages)
        rows = list(range(n + 2))  # y positions, top to bottom after invert_yaxis
        values = [s.p95 or 0.0 for s in bd.stages]
        bars = ax.barh(rows[:n], values, color=[COLORS.get(s.stage, "#bcbd22") for s in bd.stages], height=0.65)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
        left = 0.0
        for s in bd.stages:
            if s.kind == "parent" and s.p95:
                ax.barh(n, s.p95, left=left, color=COLORS[s.stage], height=0.65, edgecolor="white")
                left += s.p95
        if left:
            ax.text(left, n, f" {left:,.0f}", va="center", fontsize=8)
        if bd.ttft_p95 is not None:
            ax.barh(n + 1, bd.ttft_p95, color=COLORS[TTFT], height=0.65)
            ax.text(bd.ttft_p95, n + 1, f" {bd.ttft_p95:,.0f}", va="center", fontsize=8, fontweight="bold")
        labels = [f"└ {s.stage}" if s.kind == "sub" else s.stage for s in bd.stages]
        ax.set_yticks(rows, [*labels, "Σ parent P95s", "true TTFT P95"], fontsize=9)
        ax.axhline(n - 0.5, color="#999999", lw=0.8)
        ax.axvline(bd.slo_ms, color=SLO_COLOR, ls="--", lw=1.2, label=f"TTFT SLO {bd.slo_ms:,.0f} ms")
        ax.invert_yaxis()
        ax.set_xlim(0, max([*values, left, bd.ttft_p95 or 0.0, bd.slo_ms]) * 1.12)
        ax.xaxis.set_major_formatter(_MS)
        ax.grid(True, axis="x", alpha=0.3)
        ax.grid(False, axis="y")
        ax.set_title(f"{bd.tenant}: stage P95 over the span", loc="left")
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(
        "Where TTFT goes: stage P95s (they do not add up to the TTFT P95)",
        fontweight="bold",
        x=0.01,
        ha="left",
    )
    fig.savefig(path)


def chart_tail(path: Path, breakdowns: Sequence[Breakdown]) -> None:
    """Share of TTFT per stage in typical (P40-P60) vs the slowest 5 % of requests."""
    usable = [b for b in breakdowns if b.tail.windows_ok]
    if not usable:
        _empty(
            path,
            "Tail attribution",
            "too few complete requests per window (needs ≥ 200) to attribute the tail",
        )
        return
    fig, axes = _figure(len(usable), height=2.9)
    stages = [*PARENT_STAGES, OTHER]
    for ax, bd in zip(axes, usable, strict=True):
        x = range(len(stages))
        band = [bd.tail.band_share.get(s, 0.0) for s in stages]
        tail = [bd.tail.tail_share.get(s, 0.0) for s in stages]
        b1 = ax.bar([i - 0.2 for i in x], band, width=0.4, color="#9ecae1", label="typical requests (P40-P60)")
        b2 = ax.bar([i + 0.2 for i in x], tail, width=0.4, color="#08519c", label="slowest 5 %")
        ax.bar_label(b1, labels=[f"{v:.0%}" for v in band], fontsize=8, padding=2)
        ax.bar_label(b2, labels=[f"{v:.0%}" for v in tail], fontsize=8, padding=2)
        ax.set_xticks(list(x), stages)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(0, max([*band, *tail, 0.1]) * 1.2)
        ax.set_ylabel("share of TTFT")
        ax.set_title(
            f"{bd.tenant}: biggest P95 {bd.tail.biggest_p95_stage}, tail-dominant {bd.tail.tail_dominant_stage}",
            loc="left",
        )
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Tail attribution: what makes slow requests slow", fontweight="bold", x=0.01, ha="left")
    fig.savefig(path)


def chart_canary(path: Path, comparisons: Sequence[CanaryComparison], slo_ms: dict[str, float]) -> None:
    """Stable vs canary arm P95 per stage, side by side, with the relative change."""
    usable = [c for c in comparisons if c.stages.get("canary")]
    if not usable:
        _empty(path, "Canary comparison", "no canary traffic in the span")
        return
    fig, axes = _figure(len(usable), height=3.0)
    for ax, comp in zip(axes, usable, strict=True):
        stages = [s for s in (*PARENT_STAGES, OTHER, TTFT) if s in comp.stages["canary"]]
        stable = [comp.stages["stable"].get(s) for s in stages]
        canary = [comp.stages["canary"][s] for s in stages]
        x = range(len(stages))
        sv = [(s.p95 or 0.0) if s is not None else 0.0 for s in stable]
        cv = [c.p95 or 0.0 for c in canary]
        ax.bar(
            [i - 0.2 for i in x],
            sv,
            width=0.4,
            color="#74c476",
            label=f"stable ({', '.join(comp.versions('stable'))})",
        )
        bars = ax.bar(
            [i + 0.2 for i in x],
            cv,
            width=0.4,
            color="#fd8d3c",
            label=f"canary ({', '.join(comp.versions('canary'))})",
        )
        ratios = [comp.ratio(s) for s in stages]
        ax.bar_label(bars, labels=["" if r is None else f"{r - 1:+.0%}" for r in ratios], fontsize=8, padding=2)
        ax.axhline(
            slo_ms[comp.tenant],
            color=SLO_COLOR,
            ls="--",
            lw=1.2,
            label=f"TTFT SLO {slo_ms[comp.tenant]:,.0f} ms",
        )
        ax.set_xticks(list(x), ["TTFT" if s == TTFT else s for s in stages])
        ax.yaxis.set_major_formatter(_MS)
        ax.set_title(f"{comp.tenant}: P95 per arm (label: canary vs stable), {comp.span_text()}", loc="left")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Canary comparison", fontweight="bold", x=0.01, ha="left")
    fig.savefig(path)


def chart_alerts(path: Path, alerts: Sequence[Any], start_ms: float, end_ms: float) -> None:
    """Alert timeline over ``[start_ms, end_ms]``: pending (amber) and firing (red) intervals per alert,
    open-ended ones drawn to the end."""
    shown = [a for a in alerts if a.alertname != "Watchdog"]
    if not shown:
        _empty(path, "Alert timeline", "no alerts in the span")
        return
    fig, (ax,) = _figure(1, height=0.42 * len(shown) + 1.4)

    def num(ms: float) -> float:
        return _time(min(max(ms, start_ms), end_ms))

    for i, a in enumerate(shown):
        end = a.resolved_at if a.resolved_at is not None else end_ms
        fired = a.fired_at if a.fired_at is not None else end
        hatch = "//" if a.muted else None
        ax.barh(
            i,
            num(min(fired, end)) - num(a.active_at),
            left=num(a.active_at),
            color="#fdae6b",
            height=0.6,
            hatch=hatch,
        )
        if a.fired_at is not None and a.fired_at < end:
            ax.barh(i, num(end) - num(a.fired_at), left=num(a.fired_at), color="#d62728", height=0.6, hatch=hatch)
    ax.set_yticks(range(len(shown)), [a.label for a in shown], fontsize=8)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    _time_axis(ax, (start_ms, end_ms))
    handles = [Patch(color="#fdae6b", label="pending"), Patch(color="#d62728", label="firing")]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle("Alert timeline (event time; hatched = muted replay)", fontweight="bold", x=0.01, ha="left")
    fig.savefig(path)


def chart_completeness(
    path: Path,
    series: dict[str, list[dict[str, Any]]],
    bucket_ms: int,
    xlim: tuple[float, float] | None = None,
) -> None:
    """Incomplete records per bucket (stacked: missing stage, no first chunk, timed out, orphan), one panel per
    tenant."""
    tenants = [t for t, s in series.items() if s]
    if not tenants:
        _empty(path, "Completeness", "no window_health rows in the span")
        return
    fig, axes = _figure(len(tenants), height=2.6)
    for ax, tenant in zip(axes, tenants, strict=True):
        points = series[tenant]
        times = [_time(p["window_start"] + bucket_ms / 2) for p in points]  # bucket midpoints
        layers = [[p.get(f"{s}_share") or 0.0 for p in points] for s in STATUS_COLORS]
        ax.stackplot(
            times,
            layers,
            labels=[s.replace("_", " ") for s in STATUS_COLORS],
            colors=list(STATUS_COLORS.values()),
            alpha=0.85,
        )
        total = sum(p["total"] for p in points)
        complete = sum(p["complete"] for p in points) / total if total else 0.0
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=1))
        ax.set_ylim(0, max(0.02, max((sum(v) for v in zip(*layers, strict=True)), default=0.0) * 1.25))
        ax.set_ylabel("share of records")
        ax.set_title(f"{tenant}: {complete:.1%} of {total:,} records complete", loc="left")
        _time_axis(ax, xlim)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle("Completeness: records that are not complete", fontweight="bold", x=0.01, ha="left")
    fig.savefig(path)
