"""The gates that keep rules silent, from a real writer: it publishes its configuration's gates (paging
muted, a paused rule, the silence rule watching registered tenants only) for ``ttft rules status``, and
stores them with the join's quarantines in ``rule_gates``, which the pipeline-health board's panel reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from streams.alerting.outbox import alert_message
from streams.app.join_guard import quarantine_transition
from streams.core.guard import PRODUCER, Source
from streams.ports import free_port
from streams.settings import load_settings
from tests.support.pipeline import REPO, Pipeline, pipeline_env, produce_sync

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.clickhouse]

GATES = {
    "TTFT_PAGING_MUTED": "true",
    "TTFT_RULES__CANARY__ENABLED": "false",
    "TTFT_TENANCY__REGISTERED": "acme,globex",
}


def test_the_writer_publishes_and_stores_every_gate_and_the_board_shows_them(
    kafka_settings: Any, tmp_path: Path
) -> None:
    env = pipeline_env(kafka_settings, tmp_path, **GATES)
    pipe = Pipeline(env, tmp_path)
    settings = load_settings(topic_prefix=kafka_settings.topic_prefix)
    claim = quarantine_transition(settings, Source(PRODUCER, "svc", 3), "firing", 1.8e12, holder=3)
    try:
        writer = pipe.start("writer", free_port())
        pipe.wait_healthy(writer)
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("alerts"), [alert_message(claim)])
        pipe.wait_for(lambda: "rule gates: quarantined producer 'svc'" in writer.log(), 90, "the board's refresh")
        # The command's own configuration has no gate: what it shows is the writer's.
        bare = {k: v for k, v in env.items() if k not in GATES}
        out = subprocess.run(
            [sys.executable, "-m", "streams.cli.main", "rules", "status", "--json", "--timeout", "60"],
            env=bare, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["gates_from"] == "writer"
        assert [(g["gate"], g["rule"]) for g in status["gates"]] == [
            ("paging_muted", "*"),
            ("rule_paused", "TTFTCanaryFailed"),
            ("registered_only", "TTFTTenantSilent"),
        ]
        assert [q["source"] for q in status["quarantines"]] == ["producer 'svc'"]
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    board = json.loads((REPO / "dashboards" / "ttft-pipeline-health.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in board["panels"] if p["title"] == "What keeps rules silent"]
    sql = panel["targets"][0]["rawSql"].replace("FROM rule_gates", "FROM {db}.rule_gates")
    rows = pipe.query(sql)
    assert [(r["gate"], r["rule"], r["scope"]) for r in rows] == [
        ("paging_muted", "*", ""),
        ("quarantined", "TTFTSourceQuarantined", "producer 'svc'"),
        ("registered_only", "TTFTTenantSilent", "acme, globex + steady tenants"),
        ("rule_paused", "TTFTCanaryFailed", ""),
    ]
    assert orjson.loads(orjson.dumps(rows))  # plain JSON values, as the panel check reads them
