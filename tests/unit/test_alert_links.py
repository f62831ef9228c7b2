from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from streams.alerting.alertmanager import alertmanager_alert
from streams.rules import ALERT_NAMES, AlertTransition, RulesConfig, ingest_halted_transition
from streams.rules.exemplars import ExemplarMemory
from streams.rules.lifecycle import alert_labels
from streams.rules.links import BOARD_OF_ALERT, BOARDS, EXEMPLARS, HEX_VARIABLES, AlertLinks, placeholder_problem
from streams.rules_config import BurnWindowPair, SLOBurnRule
from tests.unit.rules_synth import W_MS, Scenario, Traffic, make_engine

REPO = Path(__file__).resolve().parents[2]
#: Ids as producers send them: any Unicode, quotes, commas, spaces, URL syntax (the contract stores them exactly).
TENANT = "acme, Inc. 'EU' ∑/?&#=%"
VERSION = 'rc-2026.02 "b"&x=1'
#: The identity labels each alert carries, as streams/rules/engine.py builds its keys (alertname, tenant,
#: stage, version) and severity; a test below checks the engine, another the Grafana-side rules.
PIPELINE_LABELS: dict[str, dict[str, str]] = {
    "TTFTStageRegression": {"tenant": TENANT, "stage": "retrieval"},
    "TTFTCanaryFailed": {"tenant": TENANT, "stage": "llm_ttft", "version": VERSION},
    "TTFTDraftAcceptanceLow": {"tenant": TENANT, "stage": "llm_ttft", "version": VERSION},
    "TTFTSLOBurn": {"tenant": TENANT, "stage": "ttft"},
    "TTFTTelemetryDegraded": {"tenant": TENANT},
    "TTFTTenantSilent": {"tenant": TENANT},
    "TTFTRuleUndecidable": {"tenant": TENANT},
    "TTFTIngestHalted": {},
    "TTFTSourceQuarantined": {"tenant": TENANT},
    "Watchdog": {},
}


def boards() -> dict[str, set[str]]:
    """uid -> variable names, from the provisioned dashboards."""
    out = {}
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text(encoding="utf-8"))
        out[model["uid"]] = {v["name"] for v in model["templating"]["list"]}
    return out


def hex_tenant_variable(uid: str) -> bool:
    """Whether the board's tenant variable takes hex(tenant_id), as links encode it."""
    model = json.loads((REPO / "dashboards").joinpath(f"{_file_of(uid)}").read_text(encoding="utf-8"))
    (var,) = [v for v in model["templating"]["list"] if v["name"] == "tenant"]
    return "hex(tenant_id) AS value" in var["query"]


def _file_of(uid: str) -> str:
    for path in (REPO / "dashboards").glob("*.json"):
        if json.loads(path.read_text(encoding="utf-8"))["uid"] == uid:
            return path.name
    raise AssertionError(f"no dashboard with uid {uid}")


def transition(alertname: str, state: str = "firing", annotations: dict[str, str] | None = None) -> AlertTransition:
    extra = PIPELINE_LABELS[alertname]
    labels = alert_labels(alertname, extra.get("tenant", ""), extra.get("stage", ""), extra.get("version", ""), "page")
    return AlertTransition(
        alertname,
        labels,
        annotations or {},
        {},
        state,
        50 * W_MS,
        48 * W_MS,
        50 * W_MS,  # type: ignore[arg-type]
    )


def check_board_link(url: str, grafana: str, labels: dict[str, str], at_ms: float) -> dict[str, list[str]]:
    """The link's target exists: its board uid, every variable it sets, ids decoded back from hex."""
    parts = urlsplit(url)
    assert url.startswith(grafana + "/d/")
    uid = parts.path.removeprefix(urlsplit(grafana).path + "/d/")
    known = boards()
    assert uid in known, f"{url}: no board {uid}"
    query = parse_qs(parts.query, strict_parsing=True)
    for key, values in query.items():
        if key.startswith("var-"):
            name = key.removeprefix("var-")
            assert name in known[uid], f"{url}: board {uid} has no variable {name}"
            (value,) = values
            if name in HEX_VARIABLES:
                assert value == value.upper()
                assert bytes.fromhex(value).decode("utf-8") == labels[name]
                if name == "tenant":
                    assert hex_tenant_variable(uid)
            else:
                assert value == labels[name]
    assert int(query["from"][0]) < at_ms < int(query["to"][0])
    assert query["orgId"] == ["1"]
    return query


@pytest.mark.parametrize("grafana", ["https://grafana.internal:3000/sub", ""])
@pytest.mark.parametrize("alertname", ALERT_NAMES)
def test_every_alert_links_to_an_existing_board_filtered_on_its_ids(alertname: str, grafana: str) -> None:
    links = AlertLinks(grafana, "https://docs.internal/ttft/runbook.md", W_MS)
    t = transition(alertname)
    annotations = links.annotations(t)
    assert annotations["runbook_url"] == f"https://docs.internal/ttft/runbook.md#{alertname.lower()}"
    query = check_board_link(annotations["dashboard_url"], grafana, t.labels, t.window_start)
    board = BOARD_OF_ALERT[alertname]
    set_vars = {k.removeprefix("var-") for k in query if k.startswith("var-")}
    assert set_vars == {n for n in board.variables if t.labels.get(n)}, "every variable the alert can fill is set"


def test_every_alert_name_has_a_board_and_the_runbook_has_the_prometheus_rule() -> None:
    assert set(BOARD_OF_ALERT) == set(ALERT_NAMES)
    known = boards()
    for board in BOARDS:
        assert board.uid in known and set(board.variables) <= known[board.uid], board
    runbook = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    assert "## TTFTAlertsRefused" in runbook


def test_slo_burn_links_the_moved_stage_drilldown() -> None:
    links = AlertLinks("http://localhost:3000", "", W_MS)
    t = transition("TTFTSLOBurn", annotations={"moved_stage": "llm_ttft"})
    annotations = links.annotations(t)
    labels = {**t.labels, "stage": "llm_ttft"}
    query = check_board_link(annotations["stage_dashboard_url"], "http://localhost:3000", labels, t.window_start)
    assert query["var-stage"] == ["llm_ttft"] and urlsplit(annotations["stage_dashboard_url"]).path == "/d/ttft-stages"
    assert annotations["runbook_url"] == "docs/runbook.md#ttftsloburn"


def test_delivery_sets_links_and_generator_url_on_alerts_the_engine_did_not_make() -> None:
    from datetime import UTC, datetime, timedelta

    halted = ingest_halted_transition("firing", 60_000.0, detail="d")
    links = AlertLinks("https://grafana.internal", "file:///srv/docs/runbook.md", W_MS)
    body = alertmanager_alert(halted, now=datetime.now(UTC), ends_in=timedelta(minutes=4), links=links)
    assert body["annotations"]["runbook_url"] == "file:///srv/docs/runbook.md#ttftingesthalted"
    assert body["generatorURL"] == body["annotations"]["dashboard_url"]
    assert urlsplit(body["generatorURL"]).path == "/d/ttft-pipeline-health"
    assert "generatorURL" not in alertmanager_alert(halted, now=datetime.now(UTC), ends_in=timedelta(minutes=4))


def _attribution(ws: float, tenant: str, version: str, ids: list[str], p95: float) -> dict[str, Any]:
    return {
        "window_start": ws,
        "tenant_id": tenant,
        "version_id": version,
        "status": "ok",
        "ttft_p95": p95,
        "tail_count": 10,
        "band_count": 40,
        "tail_share": {"retrieval": 0.2, "prompt_assemble": 0.05, "llm_ttft": 0.7, "other": 0.05},
        "band_share": {"retrieval": 0.3, "prompt_assemble": 0.1, "llm_ttft": 0.55, "other": 0.05},
        "exemplar_request_ids": ids,
    }


def test_exemplars_come_from_the_latest_attributed_window_of_the_alerts_series() -> None:
    memory = ExemplarMemory(W_MS, 10)
    arms = {("t", "v1"): "stable", ("t", "v2"): "canary"}
    memory.observe(0.0, [_attribution(0.0, "t", "v1", ["old"], 900.0)], arms)
    memory.observe(W_MS, [_attribution(W_MS, "t", "v1", ["a", "b"], 900.0)], arms)
    memory.observe(W_MS, [_attribution(W_MS, "t", "v2", ["c1", "c2", "c3"], 1200.0)], arms)
    assert memory.pick("t") == ["c1", "c2", "c3"]  # slowest series first
    assert memory.pick("t", stable_only=True) == ["a", "b"]
    assert memory.pick("t", "v1") == ["a", "b"] and memory.pick("other") == []
    memory.prune(12 * W_MS)
    assert memory.pick("t") == []


def slo_burn_page(grafana_url: str = "https://grafana.internal") -> AlertTransition:
    """The engine's first TTFTSLOBurn page of a tenant whose llm_ttft grows x6 (with tail attribution rows)."""
    pairs = (BurnWindowPair(long_windows=12, short_windows=2, burn_rate=14.4),)
    config = RulesConfig(slo_burn=SLOBurnRule(pairs=pairs), grafana_url=grafana_url, runbook_base_url="file:///r.md")
    scenario = Scenario(seed=3, arms={(TENANT, "v1"): "stable"})
    engine = make_engine(config)
    fired: list[AlertTransition] = []
    for i in range(22):
        ws, snap = scenario.window(i, {TENANT: {"v1": Traffic(llm_factor=6.0 if i >= 16 else 1.0)}})
        snap.tail_attribution.append(_attribution(ws, TENANT, "v1", [f"req-{i}-a", f"req 'b' {i}"], 1000.0))
        fired += [t for t in engine.evaluate_window(ws, snap).transitions if t.alertname == "TTFTSLOBurn"]
    return fired[0]


def test_slo_burn_page_names_the_stage_that_moved_and_carries_links_and_exemplars() -> None:
    first = slo_burn_page()
    assert first.state == "firing" and first.annotations["moved_stage"] == "llm_ttft"
    assert "The stage that moved most: llm_ttft, P95" in first.annotations["description"]
    assert "llm_ttft moved most" in first.annotations["summary"]
    assert first.numbers["moved_stage_delta_ms"] > 3_000
    assert first.numbers["moved_stage_tail_share"] == pytest.approx(0.7)
    ws = first.window_start
    assert orjson.loads(first.annotations[EXEMPLARS]) == [f"req-{ws // W_MS:.0f}-a", f"req 'b' {ws // W_MS:.0f}"]
    check_board_link(first.annotations["dashboard_url"], "https://grafana.internal", first.labels, ws)
    stage_link = first.annotations["stage_dashboard_url"]
    check_board_link(stage_link, "https://grafana.internal", {**first.labels, "stage": "llm_ttft"}, ws)
    assert first.annotations["runbook_url"] == "file:///r.md#ttftsloburn"
    slowest = {**first.labels, "request_id": f"req-{ws // W_MS:.0f}-a"}
    query = check_board_link(first.annotations["exemplar_url"], "https://grafana.internal", slowest, ws)
    assert urlsplit(first.annotations["exemplar_url"]).path == "/d/ttft-request" and "var-request_id" in query
    assert set(first.labels) == {"alertname", "severity", *PIPELINE_LABELS["TTFTSLOBurn"]}


def test_stage_regression_labels_match_the_table_and_carry_links() -> None:
    scenario = Scenario(seed=4, arms={(TENANT, "v1"): "stable"})
    engine = make_engine()
    fired = []
    for i in range(80):
        ws, snap = scenario.window(i, {TENANT: {"v1": Traffic(retrieval_factor=1.6 if i >= 70 else 1.0)}})
        fired += [t for t in engine.evaluate_window(ws, snap).transitions if t.alertname == "TTFTStageRegression"]
    assert fired and all(set(t.labels) == {"alertname", "severity", "tenant", "stage"} for t in fired)
    check_board_link(fired[-1].annotations["dashboard_url"], "", fired[-1].labels, fired[-1].window_start)
    assert EXEMPLARS not in fired[-1].annotations  # no tail attribution in this run: none invented


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("", False),
        ("https://docs.internal/ttft/runbook.md", False),
        ("file:///srv/ttft/docs/runbook.md", False),
        ("http://localhost:3000", False),
        ("http://10.1.2.3:3000/grafana", False),
        ("https://github.com/ttft-pipeline/ttft-pipeline/blob/main/docs/runbook.md", True),
        ("https://example.com/runbook.md", True),
        ("https://wiki.example.org/runbook", True),
        ("https://runbooks.example/ttft", True),
        ("https://docs.invalid/runbook.md", True),
        ("https://<docs host>/runbook.md", True),
        ("https://your-company.atlassian.net/runbook", True),
        ("docs/runbook.md", True),
        ("grafana.internal:3000", True),
        ("http://0.0.0.0:3000", True),
    ],
)
def test_placeholder_urls_are_refused(url: str, refused: bool) -> None:
    problem = placeholder_problem(url, "rules.runbook_base_url")
    assert (problem is not None) == refused, problem
    if problem is not None:
        assert "rules.runbook_base_url" in problem and repr(url) in problem
