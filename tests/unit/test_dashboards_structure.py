from __future__ import annotations

import json
import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.grafana.build import (
    DASHBOARDS_DIR,
    RULES_FILE,
    dashboard_specs,
    repo_settings,
    rules_text,
)
from streams.grafana.macros import (
    MACROS,
    QueryContext,
    Variable,
    apply_conditional_all,
    expand_macros,
    expand_query,
    interpolate_variables,
    panel_interval_ms,
)
from streams.grafana.model import (
    DATASOURCE,
    DATASOURCE_UID,
    FORMAT_TIME_SERIES,
    dashboard_json,
    render,
    slugify,
)
from tests.unit.test_no_quantile_sql import violations

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
PANEL_TYPES = {"timeseries", "table", "stat", "barchart", "bargauge", "state-timeline", "text"}
EXPECTED = {
    "ttft-overview.json": "TTFT overview",
    "ttft-stage-drilldown.json": "TTFT stage drill-down",
    "ttft-canary.json": "TTFT canary",
    "ttft-llm-levers.json": "TTFT LLM levers",
    "ttft-pipeline-health.json": "TTFT pipeline health",
}
REPLACING_TABLES = (
    "requests",
    "dead_letters",
    "stage_windows",
    "stage_strata",
    "tail_attribution",
    "window_health",
    "llm_signals",
    "canary_verdicts",
    "alerts",
    "rule_evaluations",
)
ARGLESS = ("fromTime", "toTime", "fromTime_ms", "toTime_ms", "interval_s", "table", "column")
ALLOWED_CALCS = {"lastNotNull", "last", "max", "min", "first", "firstNotNull", "count", "range"}


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def _all_sql(model: dict[str, Any]) -> list[str]:
    sql = [t["rawSql"] for p in model["panels"] for t in p["targets"]]
    sql += [v["query"] for v in model["templating"]["list"]]
    sql += [a["target"]["rawSql"] for a in model["annotations"]["list"] if "target" in a]
    return sql


def _rule_sql() -> list[str]:
    document = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return [r["data"][0]["model"]["rawSql"] for g in document["groups"] for r in g["rules"]]


def test_every_dashboard_parses_and_all_five_exist() -> None:
    models = _dashboards()
    assert {name: m["title"] for name, m in models.items()} == EXPECTED


def test_committed_files_are_generated_from_the_repository_config() -> None:
    settings = repo_settings()
    for spec in dashboard_specs(settings):
        path = DASHBOARDS_DIR / f"{spec.slug}.json"
        assert path.read_text(encoding="utf-8") == render(dashboard_json(spec)), f"run `ttft grafana build`: {path}"
    assert RULES_FILE.read_text(encoding="utf-8") == rules_text(settings), "run `ttft grafana build`"


def test_uids_are_unique_and_panel_ids_unique_per_dashboard() -> None:
    models = _dashboards().values()
    uids = [m["uid"] for m in models]
    assert len(set(uids)) == len(uids)
    for model in models:
        ids = [p["id"] for p in model["panels"]]
        assert len(set(ids)) == len(ids)
        titles = [slugify(p["title"]) for p in model["panels"]]
        assert len(set(titles)) == len(titles), "panel test ids are dashboard-slug/panel-title slugs"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_panel_has_the_datasource_and_a_known_type(name: str) -> None:
    model = _dashboards()[name]
    assert model["panels"]
    for panel in model["panels"]:
        assert panel["type"] in PANEL_TYPES
        assert panel["datasource"] == DATASOURCE
        assert panel["targets"] and all(t["datasource"] == DATASOURCE for t in panel["targets"])
        for target in panel["targets"]:
            assert target["editorType"] == "sql" and target["rawSql"].strip()
            assert target["format"] in (0, 1)
            assert (target["queryType"] == "timeseries") == (target["format"] == FORMAT_TIME_SERIES)
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE
        else:  # a custom variable: fixed options, no query, one value
            assert variable["type"] == "custom" and not variable["multi"] and not variable["includeAll"]
            assert variable["current"]["value"] in variable["query"].split(",")
    for annotation in model["annotations"]["list"][1:]:
        assert annotation["datasource"] == DATASOURCE


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_variable_is_used(name: str) -> None:
    model = _dashboards()[name]
    for variable in model["templating"]["list"]:
        others = [s for s in _all_sql(model) if s != variable["query"]]
        pattern = re.compile(rf"\$(?:{variable['name']}\b|\{{{variable['name']}[}}:])")
        assert any(pattern.search(s) for s in others), f"variable {variable['name']} is not used"


def test_tenant_version_and_stage_variables_where_they_apply() -> None:
    names = {n: [v["name"] for v in m["templating"]["list"]] for n, m in _dashboards().items()}
    for dashboard, variables in names.items():
        assert "tenant" in variables, dashboard
    for dashboard in ("ttft-stage-drilldown.json", "ttft-canary.json"):
        assert {"tenant", "version", "stage"} <= set(names[dashboard])


def test_no_panel_averages_or_sums_percentiles() -> None:
    for name, model in _dashboards().items():
        for sql in _all_sql(model):
            assert violations(sql) == [], name
        for panel in model["panels"]:
            options = panel.get("options", {})
            calcs = set(options.get("legend", {}).get("calcs", [])) | set(
                options.get("reduceOptions", {}).get("calcs", [])
            )
            assert calcs <= ALLOWED_CALCS, (name, panel["title"], calcs)
            assert not panel.get("transformations"), "transformations could average percentiles client-side"
    for sql in _rule_sql():
        assert violations(sql) == []


def test_replacing_tables_are_always_read_with_final() -> None:
    for sql in [s for m in _dashboards().values() for s in _all_sql(m)] + _rule_sql():
        for table in re.findall(r"\bFROM\s+(\w+)(?!\s+FINAL)\b", sql):
            assert table not in REPLACING_TABLES, f"{table} read without FINAL:\n{sql}"


def test_macros_expand_the_same_in_any_order() -> None:
    # Go iterates the macro map in random order: an argument-less macro followed by "(" before ")" would
    # swallow text, and the result would depend on the order.
    ctx = QueryContext(1_700_000_000_123, 1_700_003_600_456, 60_000)
    rng = random.Random(5)
    for sql in [s for m in _dashboards().values() for s in _all_sql(m)] + _rule_sql():
        frontend = interpolate_variables(apply_conditional_all(sql, {}), {})
        reference = expand_macros(frontend, ctx)
        for _ in range(4):
            order = list(MACROS)
            rng.shuffle(order)
            assert expand_macros(frontend, ctx, order) == reference
        assert "$__" not in reference, reference


def test_panels_bucket_by_at_least_one_window() -> None:
    for model in _dashboards().values():
        for panel in model["panels"]:
            hour = panel_interval_ms(0, 3_600_000, panel["maxDataPoints"], panel["interval"])
            day = panel_interval_ms(0, 86_400_000, panel["maxDataPoints"], panel["interval"])
            assert (hour, day) == (60_000, 120_000)


# --- the macro expander: exact plugin expansions ----------------------------------------------------

CTX = QueryContext(from_ms=1_700_000_000_999, to_ms=1_700_003_600_000, interval_ms=120_000)


@pytest.mark.parametrize(
    ("sql", "expanded"),
    [
        ("$__timeFilter(ws)", "ws >= toDateTime(1700000000) AND ws <= toDateTime(1700003600)"),
        (
            "$__timeFilter_ms(ws)",
            "ws >= fromUnixTimestamp64Milli(1700000000999) AND ws <= fromUnixTimestamp64Milli(1700003600000)",
        ),
        ("$__timeInterval(ws)", "toStartOfInterval(toDateTime(ws), INTERVAL 120 second)"),
        ("$__timeInterval_ms(ws)", "toStartOfInterval(toDateTime64(ws, 3), INTERVAL 120000 millisecond)"),
        ("x / ($__interval_s)", "x / (120)"),
        (
            "a >= ($__fromTime) AND b <= ($__toTime_ms)",
            "a >= (toDateTime(1700000000)) AND b <= (fromUnixTimestamp64Milli(1700003600000))",
        ),
        ("$__dateFilter(d)", "d >= toDate('2023-11-14') AND d <= toDate('2023-11-14')"),
        ("$__timeFrom(t)", "t >= '2023-11-14T22:13:20Z'"),
        # The SDK scans past an argument-less macro to the next parenthesis group: text is swallowed.
        ("SELECT $__fromTime AS f, count(x)", "SELECT toDateTime(1700000000)"),
    ],
)
def test_backend_macros_expand_exactly(sql: str, expanded: str) -> None:
    assert expand_macros(sql, CTX) == expanded


def test_a_macro_with_the_wrong_argument_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="expected 1"):
        expand_macros("$__timeFilter(ifNull(a, b))", CTX)


def test_conditional_all_and_variables() -> None:
    sql = "WHERE $__conditionalAll(tenant_id IN (${tenant:singlequote}), $tenant) AND v IN ($version)"
    everyone = {"tenant": Variable("tenant", ("a", "b")), "version": Variable("version", ("v1",), ("v1",))}
    assert expand_query(sql, CTX, everyone) == "WHERE 1=1 AND v IN (v1)"
    chosen = {"tenant": Variable("tenant", ("a", "q'x"), ("a", "q'x")), "version": everyone["version"]}
    assert expand_query(sql, CTX, chosen) == "WHERE tenant_id IN ('a','q\\'x') AND v IN (v1)"
    two = {"version": Variable("version", ("v1", "v2"), ("v1", "v2"))}
    assert interpolate_variables("v IN ($version)", two) == "v IN ('v1','v2')"


# --- provisioning --------------------------------------------------------------------------------


def _yaml(relative: str) -> dict[str, Any]:
    data = yaml.safe_load((PROVISIONING / relative).read_text(encoding="utf-8"))
    assert isinstance(data, dict) and data["apiVersion"] == 1
    return data


def test_datasource_uses_the_read_only_user_and_an_env_password() -> None:
    (ds,) = _yaml("datasources/ttft.yaml")["datasources"]
    assert ds["uid"] == DATASOURCE_UID and ds["type"] == DATASOURCE["type"]
    assert ds["jsonData"]["username"] == "grafana_ro"
    user = ET.parse(ROOT / "deploy" / "clickhouse" / "users.xml").getroot().find("users/grafana_ro")
    assert user is not None
    grants = [q.text or "" for q in user.iter("query")]
    assert grants and all(g.startswith("GRANT SELECT ON") for g in grants)
    assert re.fullmatch(r"\$\{[A-Z_]+\}", ds["secureJsonData"]["password"])
    assert re.fullmatch(r"\$\{[A-Z_]+\}", ds["jsonData"]["defaultDatabase"])


def test_dashboard_provider_points_at_the_dashboards() -> None:
    (provider,) = _yaml("dashboards/ttft.yaml")["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].endswith("dashboards/ttft")
    compose = (ROOT / "deploy" / "compose.yaml").read_text(encoding="utf-8")
    assert f"../dashboards:{provider['options']['path']}" in compose


def test_contact_point_is_alertmanager_and_grafana_rules_are_paused() -> None:
    (point,) = _yaml("alerting/contact-points.yaml")["contactPoints"]
    (receiver,) = point["receivers"]
    assert receiver["type"] == "prometheus-alertmanager"
    rules = [r for g in _yaml("alerting/rules.yaml")["groups"] for r in g["rules"]]
    assert rules and all(r["isPaused"] is True for r in rules)
    for rule in rules:
        assert rule["notification_settings"]["receiver"] == point["name"]
        assert rule["data"][0]["datasourceUid"] == DATASOURCE_UID
        assert "$tenant" not in rule["data"][0]["model"]["rawSql"]  # alerting has no dashboard variables
