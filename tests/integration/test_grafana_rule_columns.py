"""Each Grafana-side alert rule's query, expanded as the plugin does, returns its labels under the pipeline's
label names (``tenant``, ``stage``, ``version``) and one number, on the real engine (chDB)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from streams.grafana.alert_rules import alert_rules
from streams.grafana.build import repo_settings
from streams.grafana.macros import QueryContext, expand_query
from streams.rules_config import rules_config
from tests.unit.test_alert_links import PIPELINE_LABELS

pytestmark = pytest.mark.clickhouse
NUMERIC = re.compile(r"^(Nullable\()?(U?Int|Float|Decimal)")
STRING = re.compile(r"^(LowCardinality\()?(Nullable\()?String")


def _rules() -> list[dict[str, Any]]:
    settings = repo_settings()
    return [r for g in alert_rules(settings, rules_config(settings.rules))["groups"] for r in g["rules"]]


def test_rule_query_columns_are_the_pipelines_labels_and_one_number(ch_client: Client, ch_database: str) -> None:
    before = ch_client.database
    ch_client.database = ch_database
    try:
        for rule in _rules():
            check_columns(ch_client, rule)
    finally:
        ch_client.database = before


def check_columns(client: Client, rule: dict[str, Any]) -> None:
    query = rule["data"][0]
    to_ms = 1_800_000_000_000
    ctx = QueryContext(to_ms - query["relativeTimeRange"]["from"] * 1000, to_ms, query["model"]["intervalMs"])
    # DESCRIBE gives the result's columns and types without rows to fill them
    described = client.query(f"DESCRIBE ({expand_query(query['model']['rawSql'], ctx)})").result_rows
    columns = {str(row[0]): str(row[1]) for row in described}
    numeric = [name for name, kind in columns.items() if NUMERIC.match(kind)]
    assert len(numeric) == 1, (rule["title"], columns)
    labels = set(columns) - set(numeric)
    assert all(STRING.match(columns[name]) for name in labels), columns
    assert labels == set(PIPELINE_LABELS[rule["title"]]), (rule["title"], columns)
    assert labels == set(rule["notification_settings"]["group_by"]) - {"alertname"}
