from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from streams.app.metrics import WorkerMetrics
from streams.rules.links import runbook_url

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "ttft-rules.yaml"


def _rules() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for r in g["rules"]]


def test_refused_alerts_have_a_shipped_rule_on_the_metric_the_writer_exposes() -> None:
    (rule,) = [r for r in _rules() if r["alert"] == "TTFTAlertsRefused"]
    metrics = WorkerMetrics("writer", "w1")
    metrics.alerts_refused.labels("TTFTSLOBurn").inc()
    exposed = generate_latest(metrics.registry).decode()
    expr = str(rule["expr"])
    (series,) = re.findall(r"\bttft_\w+", expr)
    assert f'{series}{{alertname="TTFTSLOBurn"}} 1.0' in exposed, "the rule reads the counter the writer exposes"
    # Prometheus names the alert by the rule: the refused alert's name must move to another label.
    assert "label_replace(" in expr and '"refused_alertname", "$1", "alertname"' in expr
    assert "sum by (refused_alertname)" in expr


def test_prometheus_rules_use_the_pipelines_labels_annotations_and_runbook_sections() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    for rule in _rules():
        name = str(rule["alert"])
        assert re.fullmatch(r"TTFT[A-Z][A-Za-z]+", name)
        labels = rule["labels"]
        assert isinstance(labels, dict) and labels["severity"] in ("page", "ticket")
        annotations = rule["annotations"]
        assert isinstance(annotations, dict) and {"summary", "description", "runbook_url"} <= set(annotations)
        assert annotations["runbook_url"] == runbook_url("", name)
        assert f"\n## {name}\n" in runbook


def test_a_broker_refusing_output_pages_from_prometheus_on_the_counter_the_workers_expose() -> None:
    """The workers ride a broker outage out (streams/kafka/produce.py); the pipeline's own alerts wait behind the
    broker too, so the page for a long one comes from Prometheus."""
    (rule,) = [r for r in _rules() if r["alert"] == "TTFTProduceRefused"]
    metrics = WorkerMetrics("join", "j1")
    metrics.produce_refused.labels("batch").inc(3)
    exposed = generate_latest(metrics.registry).decode()
    (series,) = re.findall(r"\bttft_\w+", str(rule["expr"]))
    assert f'{series}{{what="batch"}} 3.0' in exposed, "the rule reads the counter the workers expose"
    assert rule["labels"]["severity"] == "page" and rule["for"] == "10m"  # type: ignore[index]
