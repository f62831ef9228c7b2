"""A gate that makes a rule silent says so where on-call looks (issue 27): ``ttft rules status`` (text and
--json) names paging_muted, a paused rule, the silence rule watching registered tenants only, and each
quarantined source; the pipeline-health board has a panel reading the same gates from the store."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from streams.alerting.outbox import alert_message
from streams.app.join_guard import quarantine_transition
from streams.cli.main import main as cli
from streams.core.guard import PRODUCER, TENANT, Source
from streams.grafana.build import DASHBOARDS_DIR
from streams.rules.gates import GATES_KEY, config_gates, gate_lines, gate_records, gates_message
from streams.rules.model import RuleEvaluation
from streams.settings import load_settings
from streams.views.rule_status import fold_gates, fold_statuses

GATED = {
    "paging_muted": True,
    "rules": {"canary": {"enabled": False}, "watchdog": False},
    "tenancy": {"registered": ["acme", "globex"]},
}


def test_the_gates_of_a_configuration() -> None:
    # By default only the silence rule is gated: it watches registered tenants, the steady ones (issue 27).
    (default,) = config_gates(load_settings())
    assert (default.gate, default.rule, default.scope) == ("registered_only", "TTFTTenantSilent", "steady tenants")
    only_listed = config_gates(load_settings(tenancy={"registered": ["acme"], "steady_windows": 0}))
    assert [g.scope for g in only_listed] == ["acme"]
    gates = config_gates(load_settings(**GATED))
    assert [(g.gate, g.rule) for g in gates] == [
        ("paging_muted", "*"),
        ("rule_paused", "TTFTCanaryFailed"),
        ("rule_paused", "Watchdog"),
        ("registered_only", "TTFTTenantSilent"),
    ]
    assert gates[-1].scope == "acme, globex + steady tenants"
    assert gate_lines(gates) == [
        "MUTED every alert: paging_muted is set: every alert is stored, none is paged (counted)",
        "PAUSED TTFTCanaryFailed: rules.canary.enabled is false: never evaluated",
        "PAUSED Watchdog: rules.watchdog is false: no heartbeat alert",
        "UNWATCHED TTFTTenantSilent (watches: acme, globex + steady tenants): only registered tenants are watched "
        "for silence: the 2 configured and those with requests in 3 consecutive windows; the shared pool's "
        "tenants are not",
    ]
    silent_off = load_settings(tenancy={"registered": []}, rules={"tenant_silence": {"enabled": False}})
    assert [(g.gate, g.rule) for g in config_gates(silent_off)] == [("rule_paused", "TTFTTenantSilent")]


def test_the_writers_gates_share_the_status_topic_without_disturbing_the_series() -> None:
    evaluation = RuleEvaluation("TTFTStageRegression", "acme", "llm_ttft", "v1", "ok", 60_000.0, 5, 40)
    gates = config_gates(load_settings(**GATED))
    values = [orjson.dumps(evaluation.to_message()), gates_message([], "w1", 1.0), gates_message(gates, "w2", 2.0)]
    assert list(fold_statuses(values)) == [evaluation.key]
    assert fold_gates(values) == gates  # the latest writer's
    assert fold_gates(values[:1]) is None  # no writer published: the command falls back to its config


def _values(topic: str) -> list[bytes | None]:
    settings = load_settings()
    if topic == settings.topic("rule-evaluations"):
        evaluation = RuleEvaluation("TTFTStageRegression", "acme", "llm_ttft", "v1", "insufficient_traffic", 6e4, 5, 3)
        return [orjson.dumps(evaluation.to_message()), gates_message(config_gates(load_settings(**GATED)), "w", 1.0)]
    pages = [
        quarantine_transition(settings, Source(PRODUCER, "svc", 1), "firing", 1.8e12, holder=1),
        quarantine_transition(settings, Source(PRODUCER, "svc", 3), "firing", 1.8e12 + 5, holder=3),
        quarantine_transition(settings, Source(TENANT, "acme"), "firing", 1.8e12, holder=0),
        quarantine_transition(settings, Source(TENANT, "acme"), "resolved", 1.8e12 + 9, 1.8e12, holder=0),
    ]
    return [alert_message(t)[1] for t in pages]


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> None:
    async def read_topic_values(settings: Any, topic: str, *, timeout_s: float = 30.0) -> list[bytes | None]:
        return _values(topic)

    monkeypatch.setattr("streams.cli.rules_cmd.read_topic_values", read_topic_values)
    monkeypatch.setattr("streams.views.quarantines.read_topic_values", read_topic_values)
    for name in [k for k in __import__("os").environ if k.startswith("TTFT_")]:
        monkeypatch.delenv(name)


def test_rules_status_says_every_gate_and_quarantine_in_text_and_json(topics: None) -> None:
    text = CliRunner().invoke(cli, ["rules", "status"])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines[:5]] == ["MUTED", "PAUSED", "PAUSED", "UNWATCHED", "QUARANTINED"]
    assert lines[4].startswith("QUARANTINED producer 'svc' since ") and "(held on partitions 1, 3)" in lines[4]
    assert not any("tenant 'acme'" in line for line in lines)  # released: no longer shown
    assert "INSUFFICIENT_TRAFFIC" in text.stdout

    raw = CliRunner().invoke(cli, ["rules", "status", "--json"])
    assert raw.exit_code == 0, raw.output
    status = json.loads(raw.stdout)
    assert status["gates_from"] == "writer"
    assert status["gates"] == gate_records(config_gates(load_settings(**GATED)))
    assert status["quarantines"] == [
        {"source": "producer 'svc'", "tenant": None, "since_ms": 1.8e12, "partitions": ["1", "3"]}
    ]
    assert [s["outcome"] for s in status["series"]] == ["insufficient_traffic"]


def test_the_pipeline_health_board_shows_the_gates_from_the_store() -> None:
    board = json.loads((DASHBOARDS_DIR / "ttft-pipeline-health.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in board["panels"] if p["title"] == "What keeps rules silent"]
    sql = panel["targets"][0]["rawSql"]
    assert "FROM rule_gates FINAL" in sql and "WHERE active" in sql
    assert GATES_KEY == b"__gates__"
