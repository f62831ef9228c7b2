"""The pure side of the OTLP bridge phase (bench/otlpbridge.py): the Collector config without spanmetrics,
the telemetry parser, the figures, the phase's flags and rows, and the join core's build in a run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bench import otlpbridge
from bench.__main__ import join_core_status, parse_args
from bench.otlpbridge import CollectorRun, Read, figures_of, sent_spans, without_spanmetrics
from bench.results import ROWS, RunReport, derive, render_markdown
from streams.otel.collector import DEFAULT_CONFIG, default_binary


def test_the_variant_drops_the_connectors_the_exporter_and_their_pipeline_only() -> None:
    committed = yaml.safe_load(DEFAULT_CONFIG.read_text())
    variant = without_spanmetrics(committed)
    assert "connectors" not in variant
    assert set(variant["exporters"]) == {"kafka"}
    assert variant["service"]["pipelines"] == {
        "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["kafka"]}
    }
    for section in ("receivers", "processors"):
        assert variant[section] == committed[section]
    assert variant["exporters"]["kafka"] == committed["exporters"]["kafka"]
    assert variant["service"]["telemetry"] == committed["service"]["telemetry"]
    assert "span_metrics/default" in committed["connectors"]  # the input is not changed


def test_the_written_variant_is_a_valid_collector_config(tmp_path: Path) -> None:
    path = otlpbridge.write_variant(DEFAULT_CONFIG, tmp_path / "nospan.yaml")
    assert yaml.safe_load(path.read_text()) == without_spanmetrics(yaml.safe_load(DEFAULT_CONFIG.read_text()))
    binary = default_binary()
    if not binary.is_file() or shutil.which(str(binary)) is None:
        pytest.skip("the Collector binary is not built (make otelcol)")
    subprocess.run([str(binary), "validate", "--config", str(path)], check=True, capture_output=True, timeout=60)


def test_sent_spans_from_the_collector_telemetry() -> None:
    page = """\
# TYPE otelcol_exporter_sent_spans counter
otelcol_exporter_sent_spans{exporter="kafka"} 9000
otelcol_exporter_sent_spans{exporter="debug"} 5
otelcol_exporter_send_failed_spans_total{exporter="kafka",x="y"} 3
otelcol_exporter_sent_metric_points{exporter="prometheus"} 36
"""
    assert sent_spans(page) == (9000.0, 3.0)
    assert sent_spans("") == (0.0, 0.0)


def test_figures_are_medians_and_the_connectors_cost_is_the_difference() -> None:
    runs = [
        CollectorRun("with", 60_000, 0.36, 14.0, 5.0),
        CollectorRun("without", 60_000, 0.30, 14.0, 5.0),
        CollectorRun("with", 60_000, 0.42, 14.0, 5.0),
        CollectorRun("without", 60_000, 0.24, 14.0, 5.0),
    ]
    reads = [
        Read("raw", 20_000, 0.05, 0.03, {}),
        Read("bridge", 20_000, 6.0, 3.6, {}),
        Read("raw", 20_000, 0.04, 0.06, {}),
        Read("bridge", 20_000, 4.0, 3.0, {}),
        Read("bridge", 20_000, 5.0, 4.2, {}),
    ]
    f = figures_of(runs, reads, 60_000)
    assert f["otel_collector_cpu_us_per_span_with_spanmetrics"] == pytest.approx(6.5)
    assert f["otel_collector_cpu_us_per_span_without_spanmetrics"] == pytest.approx(4.5)
    assert f["otel_spanmetrics_cpu_us_per_span"] == pytest.approx(2.0)
    assert f["otlp_bridge_spans_per_s"] == pytest.approx(12_000.0)
    assert f["otlp_bridge_cpu_us_per_span"] == pytest.approx(60.0)
    assert f["otlp_bridge_raw_cpu_us_per_span"] == pytest.approx(0.75)
    assert derive(f)["otlp_bridge_cpu_vs_raw"] == pytest.approx(80.0)
    empty = figures_of([], [], 0)
    assert empty["otel_spanmetrics_cpu_us_per_span"] is None and empty["otlp_bridge_cpu_us_per_span"] is None


def test_the_phase_is_wired_into_the_run() -> None:
    args = parse_args(["--only", "otlpbridge"])
    assert "otlpbridge" not in args.skip and "spanmetrics" in args.skip
    assert args.events <= 1_000
    assert (args.bridge_traces, args.bridge_rounds) == (20_000, 2)
    quick = parse_args(["--quick", "--bridge-rounds", "3"])
    assert (quick.bridge_traces, quick.bridge_rounds) == (5_000, 3)
    keys = {row.key for row in ROWS}
    for key in (
        "otlp_bridge_spans_per_s",
        "otlp_bridge_cpu_us_per_span",
        "otlp_bridge_raw_cpu_us_per_span",
        "otlp_bridge_cpu_vs_raw",
        "otel_spanmetrics_cpu_us_per_span",
        "otel_collector_cpu_us_per_span_with_spanmetrics",
        "otel_collector_cpu_us_per_span_without_spanmetrics",
        "join_core_native",
    ):
        assert key in keys
    md = render_markdown(RunReport({"otel_spanmetrics_cpu_us_per_span": 1.234, "join_core_native": 1.0}, {}, {}))
    assert "| otlp bridge | spanmetrics connectors' CPU per span (difference) | 1.23 | us |" in md
    assert "(1: yes, 0: Python source) | 1 |" in md


def test_join_core_status_follows_the_workers_environment() -> None:
    from streams.core import native

    assert join_core_status({"TTFT_NATIVE": "0"}) == "python (TTFT_NATIVE=0)"
    expected = "native" if native.check_manifest() is None else f"python ({native.check_manifest()})"
    assert join_core_status({}) == expected
