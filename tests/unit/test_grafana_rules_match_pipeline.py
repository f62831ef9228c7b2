from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from streams.grafana.alert_rules import alert_rules
from streams.grafana.build import REPO_CONFIG, repo_settings
from streams.rules.links import BOARD_OF_ALERT, runbook_url
from streams.rules_config import rules_config
from streams.settings import Settings
from tests.unit.test_alert_links import PIPELINE_LABELS, REPO, check_board_link

RULES_FILE = REPO / "deploy/grafana/provisioning/alerting/rules.yaml"
#: The one label a Grafana-side alert has beyond the pipeline's: which path raised it.
GRAFANA_ONLY = {"evaluated_by"}


def rules(settings: Settings) -> list[dict[str, Any]]:
    return [r for g in alert_rules(settings, rules_config(settings.rules))["groups"] for r in g["rules"]]


def render(template: str, labels: dict[str, str]) -> str:
    """Grafana's annotation templates as used here: ``{{ $labels.x }}`` and ``{{ printf "%X" $labels.x }}``
    (Go's %X of a string: upper-case hex of its bytes)."""
    text = re.sub(r'\{\{ printf "%X" \$labels\.(\w+) \}\}', lambda m: labels[m[1]].encode().hex().upper(), template)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)


def test_the_committed_rules_are_those_checked_here() -> None:
    committed = [r for g in yaml.safe_load(RULES_FILE.read_text("utf-8"))["groups"] for r in g["rules"]]
    assert committed == rules(repo_settings()) and REPO_CONFIG.is_file()


@pytest.mark.parametrize("rule", rules(repo_settings()), ids=lambda r: str(r["title"]))
def test_grafana_rule_labels_and_annotations_are_the_pipelines(rule: dict[str, Any]) -> None:
    title = rule["title"]
    pipeline = {"alertname", "severity", *PIPELINE_LABELS[title]}
    query_labels = set(rule["notification_settings"]["group_by"]) - {"alertname"}
    assert set(rule["labels"]) | query_labels == pipeline | GRAFANA_ONLY, "Alertmanager groups and inhibits on these"
    assert rule["notification_settings"]["group_by"][0] == "alertname"
    sql = rule["data"][0]["model"]["rawSql"]
    first_select = sql.split("\n", 1)[0]
    for label in query_labels:  # the query names its label columns as the pipeline's labels
        assert re.search(rf"\bAS {label}\b|^SELECT {label}\b|, {label}\b", first_select), (label, first_select)
    annotations = rule["annotations"]
    assert {"summary", "description", "runbook_url", "dashboard_url"} <= set(annotations)
    assert annotations["runbook_url"] == runbook_url(repo_settings().rules.runbook_base_url, title)


@pytest.mark.parametrize("rule", rules(Settings(rules={"grafana_url": "https://g.internal/grafana"})), ids=str)
def test_grafana_rule_board_links_render_to_existing_targets(rule: dict[str, Any]) -> None:
    labels = {k: v for k, v in PIPELINE_LABELS[rule["title"]].items()}
    url = render(rule["annotations"]["dashboard_url"], labels)
    assert urlsplit(url).path == f"/grafana/d/{BOARD_OF_ALERT[rule['title']].uid}"
    absolute = url.replace("from=now-3600s&to=now", "from=0&to=99999999999999")
    check_board_link(absolute, "https://g.internal/grafana", labels, 1_000.0)
