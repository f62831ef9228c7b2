"""The pure side of a run: named figures, the issue's targets, the table, the JSON file and the doc rows.

A run is a flat mapping of figure name -> number (``None``: not measured) plus run metadata. Targets are
checked against the figures only, so they can be tested without Kafka and re-evaluated from an old JSON.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Figures = dict[str, float | None]
Status = Literal["holds", "fails", "not measured"]

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the results table: which figure, how to show it."""

    section: str
    label: str
    key: str
    unit: str
    digits: int = 0


ROWS: tuple[Row, ...] = (
    Row("throughput", "A: raw aiokafka getmany + orjson", "raw_events_per_s", "ev/s"),
    Row("throughput", "B: naive Faust join (table write per event)", "naive_events_per_s", "ev/s"),
    Row("throughput", "ours: join + writer, to count() FINAL", "pipeline_events_per_s", "ev/s"),
    Row("throughput", "ours / A", "pipeline_vs_raw", "x", 3),
    Row("throughput", "ours / B", "pipeline_vs_naive", "x", 2),
    Row("throughput", "quix: same join, Quix Streams", "quix_events_per_s", "ev/s"),
    Row("cpu", "A: consumer CPU per event", "raw_cpu_us_per_event", "us", 1),
    Row("cpu", "B: naive worker CPU per event", "naive_cpu_us_per_event", "us", 1),
    Row("cpu", "ours: join worker CPU per event", "pipeline_join_cpu_us_per_event", "us", 1),
    Row("cpu", "ours: writer CPU per event", "pipeline_writer_cpu_us_per_event", "us", 1),
    Row("cpu", "machine busy during ours", "pipeline_machine_busy", "%", 0),
    Row("cpu", "join core compiled with mypyc (1: yes, 0: Python source)", "join_core_native", ""),
    Row("lag", "offered load", "lag_offered_eps", "ev/s"),
    Row("lag", "achieved produce rate", "lag_achieved_eps", "ev/s"),
    Row("lag", "join grace", "join_grace_ms", "ms"),
    Row("lag", "produce -> row visible P50", "lag_p50_ms", "ms"),
    Row("lag", "produce -> row visible P95", "lag_p95_ms", "ms"),
    Row("lag", "produce -> row visible max", "lag_max_ms", "ms"),
    Row("lag", "high: offered load", "lag_high_offered_eps", "ev/s"),
    Row("lag", "high: achieved produce rate", "lag_high_achieved_eps", "ev/s"),
    Row("lag", "high: produce -> row visible P50", "lag_high_p50_ms", "ms"),
    Row("lag", "high: produce -> row visible P95", "lag_high_p95_ms", "ms"),
    Row("lag", "high: produce -> row visible max", "lag_high_max_ms", "ms"),
    Row("memory", "peak RSS join worker (throughput run)", "rss_peak_join_mb", "MiB", 1),
    Row("memory", "peak RSS writer (throughput run)", "rss_peak_writer_mb", "MiB", 1),
    Row("memory", "peak RSS naive Faust worker", "rss_peak_naive_mb", "MiB", 1),
    Row("memory", "peak RSS Kafka broker (JVM)", "rss_peak_broker_mb", "MiB", 1),
    Row("memory", "open requests held", "open_requests", ""),
    Row("memory", "join RSS with them open", "rss_open_requests_mb", "MiB", 1),
    Row("memory", "join RSS per open request", "rss_per_open_request_bytes", "B"),
    Row("memory", "restarted join consumes again (requests open in the changelog)", "restart_consume_s", "s"),
    Row("memory", "ClickHouse bytes per stored request", "ch_bytes_per_request", "B", 1),
    Row("scale-out", "1 join worker", "scale_1w_events_per_s", "ev/s"),
    Row("scale-out", "2 join workers", "scale_2w_events_per_s", "ev/s"),
    Row("scale-out", "2 workers / 1", "scale_ratio", "x", 2),
    Row("scale-out", "1w: join worker cores", "scale_1w_join_cores", "cores", 2),
    Row("scale-out", "1w: broker cores", "scale_1w_broker_cores", "cores", 2),
    Row("scale-out", "1w: machine busy", "scale_1w_machine_busy", "%", 0),
    Row("scale-out", "2w: join worker cores (sum)", "scale_2w_join_cores", "cores", 2),
    Row("scale-out", "2w: broker cores", "scale_2w_broker_cores", "cores", 2),
    Row("scale-out", "2w: machine busy", "scale_2w_machine_busy", "%", 0),
    Row("scale-out", "1w: join CPU per event", "scale_1w_join_cpu_us_per_event", "us", 1),
    Row("scale-out", "2w: join CPU per event", "scale_2w_join_cpu_us_per_event", "us", 1),
    Row("scale-out", "2w / 1w join CPU per event", "scale_cpu_ratio", "x", 2),
    Row("close burst", "records in the closing window", "close_window_records", ""),
    Row("close burst", "writer time closing it", "close_seconds", "s", 2),
    Row("close burst", "commit delay before the close, P50", "close_commit_delay_before_p50_ms", "ms"),
    Row("close burst", "commit delay while it closed, max", "close_commit_delay_during_max_ms", "ms"),
    Row("otel", "traces sent through the Collector", "otel_traces", ""),
    Row("otel", "retrieval P95 exact", "otel_retrieval_p95_exact_ms", "ms", 1),
    Row("otel", "retrieval P95 ours, error", "otel_retrieval_p95_ours_err", "%", 2),
    Row(
        "otel", "retrieval P95 spanmetrics default buckets, error", "otel_retrieval_p95_spanmetrics_default_err", "%", 1
    ),
    Row("otel", "retrieval P95 spanmetrics tuned buckets, error", "otel_retrieval_p95_spanmetrics_tuned_err", "%", 1),
    Row("otel", "llm_ttft (first chunk) P95 exact", "otel_llm_ttft_p95_exact_ms", "ms", 1),
    Row("otel", "llm_ttft P95 ours, error", "otel_llm_ttft_p95_ours_err", "%", 2),
    Row(
        "otel", "LLM span P95 (spanmetrics default) vs first chunk", "otel_llm_ttft_p95_spanmetrics_default_err", "%", 0
    ),
    Row("otel", "LLM span P95 (spanmetrics tuned) vs first chunk", "otel_llm_ttft_p95_spanmetrics_tuned_err", "%", 0),
    Row("otlp bridge", "spans read (one Collector run's topic)", "otlp_bridge_spans", ""),
    Row("otlp bridge", "bridge (runner + OtlpFold) first fetch -> last commit", "otlp_bridge_spans_per_s", "spans/s"),
    Row("otlp bridge", "bridge CPU per span", "otlp_bridge_cpu_us_per_span", "us", 1),
    Row(
        "otlp bridge",
        "raw aiokafka read of the same messages, CPU per span",
        "otlp_bridge_raw_cpu_us_per_span",
        "us",
        2,
    ),
    Row("otlp bridge", "bridge / raw CPU per span", "otlp_bridge_cpu_vs_raw", "x", 0),
    Row(
        "otlp bridge",
        "Collector CPU per span, with spanmetrics",
        "otel_collector_cpu_us_per_span_with_spanmetrics",
        "us",
        2,
    ),
    Row(
        "otlp bridge",
        "Collector CPU per span, without spanmetrics",
        "otel_collector_cpu_us_per_span_without_spanmetrics",
        "us",
        2,
    ),
    Row(
        "otlp bridge", "spanmetrics connectors' CPU per span (difference)", "otel_spanmetrics_cpu_us_per_span", "us", 2
    ),
    Row("isolation", "join CPU per message, good tenants alone (offline fold)", "isolation_alone_cpu_us", "us", 1),
    Row("isolation", "with issue 14's hostile tenant", "isolation_issue14_cpu_us", "us", 1),
    Row("isolation", "with it and issue 27's attacks (mixed)", "isolation_mixed_cpu_us", "us", 1),
    Row("isolation", "the hostile messages alone", "isolation_hostile_cpu_us", "us", 1),
    Row("isolation", "good + issue 27's attacks only", "isolation_attacks_cpu_us", "us", 1),
    Row("isolation", "outputs per message, good alone", "isolation_alone_outputs_per_msg", "", 2),
    Row("isolation", "outputs per message, hostile alone", "isolation_hostile_outputs_per_msg", "", 2),
    Row("isolation", "mixed / alone", "isolation_mixed_over_alone", "x", 2),
    Row("isolation", "mixed / issue 14's", "isolation_mixed_over_issue14", "x", 2),
    Row("isolation", "good + issue 27's attacks only / alone", "isolation_attacks_over_alone", "x", 2),
    Row("isolation", "mixed / (alone + hostile, apart), total CPU", "isolation_interaction", "x", 2),
    Row("isolation (broker)", "join CPU per message, good tenants alone", "isolation_broker_alone_cpu_us", "us", 1),
    Row("isolation (broker)", "with issue 14's hostile tenant", "isolation_broker_issue14_cpu_us", "us", 1),
    Row("isolation (broker)", "with it and issue 27's attacks (mixed)", "isolation_broker_mixed_cpu_us", "us", 1),
    Row("isolation (broker)", "the hostile messages alone", "isolation_broker_hostile_cpu_us", "us", 1),
    Row("isolation (broker)", "good + issue 27's attacks only", "isolation_broker_attacks_cpu_us", "us", 1),
    Row("isolation (broker)", "mixed / issue 14's (issue 27: <= 1.2)", "isolation_broker_mixed_over_issue14", "x", 2),
    Row(
        "isolation (broker)",
        "mixed / issue 14's, median of the rounds",
        "isolation_broker_mixed_over_issue14_rounds",
        "x",
        2,
    ),
    Row("isolation (broker)", "good + issue 27's attacks only / alone", "isolation_broker_attacks_over_alone", "x", 2),
    Row("isolation (broker)", "mixed / alone", "isolation_broker_mixed_over_alone", "x", 2),
    Row("isolation (broker)", "mixed / (alone + hostile, apart), total CPU", "isolation_broker_interaction", "x", 2),
    Row("what-if", "stored requests replayed", "whatif_requests", ""),
    Row("what-if", "ttft whatif, one lever, 200 resamples: process wall (median)", "whatif_seconds", "s", 2),
    Row("what-if", "ttft whatif: peak RSS", "whatif_rss_peak_mb", "MiB", 1),
    Row("what-if", "ttft whatif --rank: process wall", "whatif_rank_seconds", "s", 2),
    Row("simulator", "simulator", "sim_events_per_s", "ev/s"),
    Row("simulator", "orjson.dumps of the same events", "orjson_dump_events_per_s", "ev/s"),
    Row("simulator", "simulator / orjson.dumps", "sim_vs_orjson", "x", 3),
)


@dataclass(frozen=True, slots=True)
class TargetResult:
    """One target of issue 7 checked against a run."""

    name: str
    measured: str
    status: Status


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def derive(figures: Figures) -> Figures:
    """Add the ratios that follow from the measured figures (idempotent)."""
    out = dict(figures)
    out["pipeline_vs_raw"] = _ratio(out.get("pipeline_events_per_s"), out.get("raw_events_per_s"))
    out["pipeline_vs_naive"] = _ratio(out.get("pipeline_events_per_s"), out.get("naive_events_per_s"))
    out["scale_ratio"] = _ratio(out.get("scale_2w_events_per_s"), out.get("scale_1w_events_per_s"))
    out["sim_vs_orjson"] = _ratio(out.get("sim_events_per_s"), out.get("orjson_dump_events_per_s"))
    out["otlp_bridge_cpu_vs_raw"] = _ratio(
        out.get("otlp_bridge_cpu_us_per_span"), out.get("otlp_bridge_raw_cpu_us_per_span")
    )
    for key in ("scale_1w", "scale_2w"):  # join CPU per event: cores over events/s
        cores, eps = out.get(f"{key}_join_cores"), out.get(f"{key}_events_per_s")
        out[f"{key}_join_cpu_us_per_event"] = None if not cores or not eps else cores / eps * 1e6
    out["scale_cpu_ratio"] = _ratio(
        out.get("scale_2w_join_cpu_us_per_event"), out.get("scale_1w_join_cpu_us_per_event")
    )
    return out


def _check(value: float | None, ok: bool, text: str) -> tuple[str, Status]:
    if value is None:
        return "-", "not measured"
    return text, "holds" if ok else "fails"


def evaluate_targets(figures: Mapping[str, float | None]) -> list[TargetResult]:
    """The targets of issue 7 (2-core machine class), each with what this run measured."""
    f = derive(dict(figures))
    results: list[TargetResult] = []

    def add(name: str, value: float | None, ok: bool, text: str) -> None:
        measured, status = _check(value, ok, text)
        results.append(TargetResult(name, measured, status))

    v = f.get("pipeline_vs_raw")
    add("ours >= 25 % of baseline A", v, v is not None and v >= 0.25, f"{(v or 0) * 100:.1f} %")
    v = f.get("pipeline_vs_naive")
    add("ours >= 5x baseline B", v, v is not None and v >= 5.0, f"{v or 0:.2f}x")
    v = f.get("pipeline_events_per_s")
    add(">= 20,000 ev/s end to end, one join worker", v, v is not None and v >= 20_000, f"{v or 0:,.0f} ev/s")
    p95, grace = f.get("lag_p95_ms"), f.get("join_grace_ms")
    limit = (grace or 0) + 2_000
    offered = f.get("lag_offered_eps")
    add(
        f"lag P95 <= grace + 2 s at {offered or 5000:,.0f} ev/s",
        p95,
        p95 is not None and p95 <= limit,
        f"{p95 or 0:,.0f} ms (limit {limit:,.0f} ms)",
    )
    per_open, n_open = f.get("rss_per_open_request_bytes"), f.get("open_requests")
    rss_open = f.get("rss_open_requests_mb")
    if rss_open is not None and per_open is not None and n_open:
        # Fewer open requests than 100 k (a --quick run): extrapolate linearly, and say so.
        rss_100k = rss_open + per_open * (100_000 - n_open) / (1024 * 1024)
        note = "" if n_open >= 100_000 else f" (extrapolated from {n_open:,.0f})"
        add(
            "join RSS <= 500 MB at 100 k open requests",
            rss_100k,
            rss_100k <= 500,
            f"{rss_100k:.0f} MiB{note}",
        )
    else:
        add("join RSS <= 500 MB at 100 k open requests", None, False, "")
    add(
        "<= 2 KiB per open request",
        per_open,
        per_open is not None and per_open <= 2048,
        f"{per_open or 0:,.0f} B",
    )
    v = f.get("scale_ratio")
    add("2 join workers >= 1.3x one", v, v is not None and v >= 1.3, f"{v or 0:.2f}x")
    results += _issue13_targets(f, add)
    _issue24_targets(f, add)
    v, n, rss = f.get("whatif_seconds"), f.get("whatif_requests"), f.get("whatif_rss_peak_mb")
    add(
        "issue 26: ttft whatif, one lever, 200 resamples, 1M stored requests <= 10 s",
        v,
        v is not None and v <= 10.0 and (n or 0) >= 1_000_000,
        f"{v or 0:.1f} s over {n or 0:,.0f} requests, peak RSS {rss or 0:,.0f} MiB",
    )
    v = f.get("isolation_broker_mixed_over_issue14")
    add(
        "issue 27: join CPU per message with its attacks <= 1.2x the isolation run without them (real broker)",
        v,
        v is not None and v <= 1.2,
        f"{v or 0:.2f}x (best passes; median of the rounds "
        f"{f.get('isolation_broker_mixed_over_issue14_rounds') or 0:.2f}x); "
        f"good + attacks / good alone {f.get('isolation_broker_attacks_over_alone') or 0:.2f}x, "
        f"mixed / good alone {f.get('isolation_broker_mixed_over_alone') or 0:.2f}x, "
        f"interaction {f.get('isolation_broker_interaction') or 0:.2f}x",
    )
    errs = [f.get(f"otel_{stage}_p95_ours_err") for stage in ("retrieval", "llm_ttft")]
    worst = None if any(e is None for e in errs) else max(e for e in errs if e is not None)
    add(
        "issue 15: ours P95 within 1 % of exact (retrieval, llm_ttft)",
        worst,
        worst is not None and worst <= 0.01,
        f"{(worst or 0) * 100:.2f} %",
    )
    return results


def _issue13_targets(f: Mapping[str, float | None], add: Callable[[str, float | None, bool, str], None]) -> list[Any]:
    """The batch hot path's targets (issue 13); ``add`` appends to the caller's list."""
    v = f.get("pipeline_join_cpu_us_per_event")
    add("issue 13: join CPU <= 35 us/event", v, v is not None and v <= 35, f"{v or 0:.1f} us")
    v = f.get("pipeline_writer_cpu_us_per_event")
    add("issue 13: writer CPU <= 15 us/event", v, v is not None and v <= 15, f"{v or 0:.1f} us")
    p95, grace = f.get("lag_p95_ms"), f.get("join_grace_ms")
    limit = (grace or 0) + 1_000
    add("issue 13: lag P95 <= grace + 1 s at 5k ev/s", p95, p95 is not None and p95 <= limit, f"{p95 or 0:,.0f} ms")
    p95, offered = f.get("lag_high_p95_ms"), f.get("lag_high_offered_eps")
    limit = (grace or 0) + 2_000
    add(
        f"issue 13: lag P95 <= grace + 2 s at {offered or 20_000:,.0f} ev/s",
        p95,
        p95 is not None and p95 <= limit,
        f"{p95 or 0:,.0f} ms",
    )
    v = f.get("rss_per_open_request_bytes")
    add("issue 13: <= 1 KiB per open request", v, v is not None and v <= 1024, f"{v or 0:,.0f} B")
    v = f.get("restart_consume_s")
    add("issue 13: restarted join consumes within 20 s", v, v is not None and v <= 20, f"{v or 0:.1f} s")
    v = f.get("pipeline_vs_raw")
    add("issue 13: ours >= 12 % of baseline A", v, v is not None and v >= 0.12, f"{(v or 0) * 100:.1f} %")
    v = f.get("pipeline_vs_naive")
    add("issue 13: ours >= 10x baseline B", v, v is not None and v >= 10.0, f"{v or 0:.2f}x")
    v = f.get("pipeline_events_per_s")
    add("issue 13: >= 25,000 ev/s end to end", v, v is not None and v >= 25_000, f"{v or 0:,.0f} ev/s")
    v, n = f.get("close_commit_delay_during_max_ms"), f.get("close_window_records")
    add(
        "issue 13: closing a >= 150k-record window delays commits <= 1 s",
        v,
        v is not None and v <= 1_000 and (n or 0) >= 150_000,
        f"{v or 0:,.0f} ms over {n or 0:,.0f} records",
    )
    v = f.get("scale_cpu_ratio")
    add("issue 13: 2 join workers' CPU/event within 15 % of one", v, v is not None and v <= 1.15, f"{v or 0:.2f}x")
    return []


def _issue24_targets(f: Mapping[str, float | None], add: Callable[[str, float | None, bool, str], None]) -> None:
    """The runner's targets (issue 24): the join's CPU per event against the raw consume's, the 20k ev/s
    lag run's producer at its offered rate, the OTLP bridge measured beside spanmetrics."""
    join, raw = f.get("pipeline_join_cpu_us_per_event"), f.get("raw_cpu_us_per_event")
    v = join / raw if join is not None and raw else None
    add("issue 24: join CPU/event <= 5x the raw consume's", v, v is not None and v <= 5.0, f"{v or 0:.2f}x")
    v, offered = f.get("lag_high_achieved_eps"), f.get("lag_high_offered_eps")
    ok = v is not None and offered is not None and v >= 0.98 * offered
    add("issue 24: the 20k ev/s lag run reaches its offered rate", v, ok, f"{v or 0:,.0f} of {offered or 0:,.0f} ev/s")
    v, peer = f.get("otlp_bridge_cpu_us_per_span"), f.get("otel_spanmetrics_cpu_us_per_span")
    shown = f"{v or 0:.1f} us/span (spanmetrics {peer or 0:.2f})"
    add("issue 24: OTLP bridge CPU per span measured beside spanmetrics", v, v is not None and peer is not None, shown)


def format_value(value: float | None, row: Row) -> str:
    """A figure as shown in the table: thousands separators, the row's digits, '-' when not measured."""
    if value is None:
        return "-"
    if row.unit == "%":
        return f"{value * 100:.{row.digits}f}"
    return f"{value:,.{row.digits}f}"


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory and Python of this machine."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kib = 0
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def git_commit() -> str:
    """The checked-out commit (short), with ``+dirty`` when the tree has changes; ``unknown`` without git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


@dataclass
class RunReport:
    """Everything one ``python -m bench`` run produced."""

    figures: Figures
    meta: dict[str, Any]
    details: dict[str, Any]

    @property
    def targets(self) -> list[TargetResult]:
        return evaluate_targets(self.figures)

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "figures": derive(self.figures),
            "targets": [{"name": t.name, "measured": t.measured, "status": t.status} for t in self.targets],
            "details": self.details,
        }

    def write(self, directory: Path = RESULTS_DIR) -> Path:
        """One JSON file per run, named by its start time."""
        directory.mkdir(parents=True, exist_ok=True)
        stamp = str(self.meta.get("started_at", datetime.now(UTC).isoformat()))
        name = "bench-" + stamp.replace(":", "").replace("-", "").split(".")[0] + ".json"
        path = directory / name
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False, default=str) + "\n")
        return path


def render_markdown(report: RunReport) -> str:
    """The results section of docs/benchmarks.md for one run: figures and targets as tables."""
    figures = derive(report.figures)
    m = report.meta
    machine = m.get("machine", {})
    lines = [
        f"Run of {m.get('started_at', '?')} on {machine.get('cpu', '?')} ({machine.get('cores', '?')} cores, "
        f"{machine.get('memory_gib', '?')} GiB), commit `{m.get('commit', '?')}`, Python "
        f"{machine.get('python', '?')}, {m.get('wall_s', 0):.0f} s wall"
        + (f", load average {m['loadavg_start'][0]:.1f} at the start." if m.get("loadavg_start") else "."),
        "",
        "| section | figure | value | unit |",
        "|---|---|---:|---|",
    ]
    for row in ROWS:
        lines.append(f"| {row.section} | {row.label} | {format_value(figures.get(row.key), row)} | {row.unit} |")
    lines += ["", "| target | measured | status |", "|---|---|---|"]
    for t in report.targets:
        lines.append(f"| {t.name} | {t.measured} | {t.status} |")
    return "\n".join(lines) + "\n"


def render_tables(report: RunReport) -> list[Any]:
    """The figures and the targets as rich tables (printed at the end of a run)."""
    from rich.table import Table

    figures = derive(report.figures)
    m = report.meta
    table = Table(title=f"ttft-pipeline bench - {m.get('started_at', '')} - commit {m.get('commit', '?')}")
    for name, justify in (("section", "left"), ("figure", "left"), ("value", "right"), ("unit", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    last = ""
    for row in ROWS:
        table.add_row(
            "" if row.section == last else row.section,
            row.label,
            format_value(figures.get(row.key), row),
            row.unit,
        )
        last = row.section
    targets = Table(title="targets (issue 7, 2-core machine class)")
    targets.add_column("target")
    targets.add_column("measured", justify="right")
    targets.add_column("status")
    colour = {"holds": "green", "fails": "red", "not measured": "yellow"}
    for t in report.targets:
        targets.add_row(t.name, t.measured, f"[{colour[t.status]}]{t.status}[/]")
    return [table, targets]
