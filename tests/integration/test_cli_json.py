"""Every read command's ``--json`` parsed against the real thing (issue 29): the store commands over the
embedded store, the topic commands and ``kafka status`` against the real broker, ``worker --log-format
json``'s stderr line by line. (Commands that need neither are parsed in tests/unit/test_cli_conventions.py;
tests/unit/test_cli_conventions.py also holds every command to --json or a stated reason.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from clickhouse_connect.driver.client import Client

from streams.core.windows import aggregate_windows
from streams.ports import free_port
from streams.rules.model import RuleEvaluation
from streams.settings import Settings
from streams.store.aggregates_store import insert_window_aggregates
from streams.store.requests_store import insert_requests
from tests.support.pipeline import pipeline_env, produce_sync
from tests.support.recent import iso_utc
from tests.support.window_records import HOUR_START_MS, WINDOW_MS, synthetic_records

TTFT = str(Path(sys.executable).with_name("ttft"))
WINDOWS = 6
SPAN = ["--since", iso_utc(HOUR_START_MS), "--until", iso_utc(HOUR_START_MS + WINDOWS * WINDOW_MS)]


def ttft(*args: str) -> Result:
    from streams.cli.main import main

    return CliRunner().invoke(main, list(args), terminal_width=140)


def parsed(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stdout alone: warnings and progress are on stderr


# --- the store ---------------------------------------------------------------------------------------------


@pytest.fixture
def store(ch_client: Client, ch_database: str, ch_session_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test database with 1,200 requests over six closed windows; returns one stored request id."""
    records = synthetic_records(1_200, span_ms=WINDOWS * WINDOW_MS, tenants=("acme", "globex"))
    insert_requests(ch_client, ch_database, records)
    for aggregate in aggregate_windows(records, Settings()).values():
        insert_window_aggregates(ch_client, ch_database, {"stage_windows": aggregate.stage_windows})
    monkeypatch.setenv("TTFT_CLICKHOUSE_URL", f"chdb://{ch_session_path}")
    monkeypatch.setenv("TTFT_CLICKHOUSE_DATABASE", ch_database)
    return str(next(r["request_id"] for r in records if r["tenant_id"] == "acme"))


@pytest.mark.clickhouse
def test_store_commands_print_json(store: str, tmp_path: Path) -> None:
    record = parsed(ttft("request", "--json", "--tenant", "acme", store))
    assert record["request_id"] == store and record["tenant_id"] == "acme"

    every = parsed(ttft("breakdown", "--json", *SPAN))
    assert sorted(b["tenant"] for b in every) == ["acme", "globex"] and all(b["stages"] for b in every)
    one = parsed(ttft("breakdown", "--json", "--tenant", "acme", *SPAN))
    assert one["tenant"] == "acme"

    predicted = parsed(ttft("whatif", "--json", "--tenant", "acme", "--scale", "llm_ttft=0.8", *SPAN))
    assert predicted["predicted"]["p95"] < predicted["observed"]["p95"]

    report = parsed(ttft("report", "--json", "--out", str(tmp_path / "report"), *SPAN))
    assert Path(report["index"]).is_file()
    assert report["report"] == orjson.loads(Path(report["report_json"]).read_bytes())


@pytest.mark.clickhouse
def test_the_version_filter_old_spelling_warns_and_stdout_stays_json(store: str) -> None:
    chosen = parsed(ttft("request", "--json", "--tenant", "acme", store))["version_id"]
    new = ttft("breakdown", "--json", "--tenant", "acme", "--model-version", chosen, *SPAN)
    old = ttft("breakdown", "--json", "--tenant", "acme", "--version", chosen, *SPAN)
    assert parsed(new)["version"] == parsed(old)["version"] == chosen
    assert parsed(new) == parsed(old)
    assert new.stderr == "" and "deprecated" in old.stderr
    lever = ["--scale", "llm_ttft=0.8", *SPAN]
    whatif_old = ttft("whatif", "--json", "--tenant", "acme", "--version", chosen, *lever)
    whatif_new = ttft("whatif", "--json", "--tenant", "acme", "--model-version", chosen, *lever)
    whatif_all = ttft("whatif", "--json", "--tenant", "acme", *lever)
    assert parsed(whatif_old) == parsed(whatif_new) and "deprecated" in whatif_old.stderr
    assert parsed(whatif_new)["requests"] <= parsed(whatif_all)["requests"]


@pytest.mark.clickhouse
def test_db_migrate_json_on_a_fresh_database_with_progress_on_stderr(
    store: str, ch_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = f"t_migrate_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TTFT_CLICKHOUSE_DATABASE", fresh)
    try:
        first = ttft("db", "migrate", "--json")
        report = parsed(first)
        assert report["database"] == fresh and report["applied"][0] == "0001_requests"
        assert f"{report['applied'][-1]} [1/" in first.stderr  # each statement announced
        assert parsed(ttft("db", "migrate", "--json"))["applied"] == []
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {fresh}")


# --- the broker ------------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_topic_commands_print_json(kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    env = pipeline_env(kafka_settings, kafka_settings.home)
    for key in [k for k in os.environ if k.startswith("TTFT_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("TTFT_"):
            monkeypatch.setenv(key, value)
    evaluation = RuleEvaluation(
        rule="TTFTStageRegression",
        tenant="acme",
        stage="llm_ttft",
        version="v1",
        outcome="insufficient_traffic",
        window_start=float(HOUR_START_MS),
        span_windows=5,
        samples=12,
    )
    topic = kafka_settings.topic("rule-evaluations")
    produce_sync(
        kafka_settings.kafka_bootstrap, topic, [(evaluation.key.encode(), orjson.dumps(evaluation.to_message()))]
    )
    status = parsed(ttft("rules", "status", "--json", "--timeout", "60"))
    # The defaults gate only the silence rule: it watches registered (configured or steady) tenants.
    assert [(g["gate"], g["scope"]) for g in status["gates"]] == [("registered_only", "steady tenants")]
    assert (status["gates_from"], status["quarantines"]) == ("config", [])
    assert status["series"] == [
        {
            "tenant": "acme",
            "rule": "TTFTStageRegression",
            "stage": "llm_ttft",
            "version": "v1",
            "outcome": "insufficient_traffic",
            "decided": False,
            "span_windows": 5,
            "samples": 12,
            "window_start": float(HOUR_START_MS),
            "last_decided_at": None,
        }
    ]

    produced = parsed(ttft("simulate", "--json", "--duration", "10", "--rate", "5", "--as-fast-as-possible"))
    assert produced["events"] > 0 and produced["topic"] == kafka_settings.topic("stage-events")

    frame = parsed(ttft("top", "--json", "--from-beginning"))
    assert frame["tenants"] == [] and frame["bad_messages"] == 0  # no window closed: nobody aggregates here


@pytest.mark.kafka
@pytest.mark.e2e
def test_kafka_status_json_for_the_broker_ttft_kafka_up_started(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    env.update(TTFT_HOME=str(tmp_path), TTFT_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TTFT, *args], env=env, capture_output=True, text=True, timeout=180)

    assert json.loads(run("kafka", "status", "--json").stdout)["running"] is False
    up = run("kafka", "up")
    try:
        assert up.returncode == 0, up.stderr
        status = run("kafka", "status", "--json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["running"] and report["serving"] and report["pid"] and report["problem"] is None
    finally:
        run("kafka", "down")


@pytest.mark.kafka
@pytest.mark.e2e
def test_worker_logs_one_json_object_per_line(kafka_settings: Settings, tmp_path: Path) -> None:
    env = pipeline_env(kafka_settings, tmp_path)
    command = [TTFT, "worker", "--role", "join", "--log-format", "json", "--log-level", "info"]
    stderr_path = tmp_path / "worker.stderr"
    with stderr_path.open("w") as stderr:
        worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 90
            while "metrics on http" not in stderr_path.read_text() and time.monotonic() < deadline:
                assert worker.poll() is None, stderr_path.read_text()
                time.sleep(0.2)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
    lines = [line for line in stderr_path.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert {"ts", "level", "logger", "message", "pid"} <= set(entries[0])
    assert any("metrics on http" in e["message"] and e["logger"] == "ttft.worker" for e in entries)
    assert any(e["logger"].startswith(("faust", "mode", "aiokafka")) for e in entries)  # Faust's own, too
