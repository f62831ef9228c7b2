from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.recent import RECENT_DAY_MS

pytestmark = pytest.mark.clickhouse

TTFT = str(Path(sys.executable).with_name("ttft"))

_INSERT = textwrap.dedent(
    """
    from schemas.records import RequestRecord, record_version
    from streams.settings import load_settings
    from streams.store.client import make_client
    from streams.store.requests_store import insert_requests

    settings = load_settings()
    DAY = @DAY@
    record = RequestRecord(
        request_id="req 'ü' 1", tenant_id="租户", status="missing_stage", missing_stages=["llm_ttft"],
        started_at=DAY + 1234.0, first_token_at=DAY + 2734.0, window_start=float(DAY),
        ttft_ms=1500.0, retrieval_ms=420.5, prompt_assemble_ms=80.0, custom_stages={"guardrail": 12.0},
        stage_repeats={"retrieval": 1}, prompt_tokens=2048, prompt_cache_hit=False, event_count=4,
        trace_id="5b8efff798038103d269b633813fc60c",
        record_version=record_version(4, "missing_stage"),
    )
    insert_requests(make_client(settings), settings.clickhouse_database, [record.model_dump()])
    """
).replace("@DAY@", str(RECENT_DAY_MS))


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    env["TTFT_HOME"] = str(home)
    env["COLUMNS"] = "120"
    return env


def _run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=_env(home), capture_output=True, text=True, timeout=120, check=False)


def test_db_migrate_and_request_commands(tmp_path: Path) -> None:
    first = _run([TTFT, "db", "migrate"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_requests" in first.stdout
    assert "applied 0002_dead_letters" in first.stdout
    second = _run([TTFT, "db", "migrate"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
    assert (tmp_path / "chdb").is_dir()

    inserted = _run([sys.executable, "-c", _INSERT], tmp_path)
    assert inserted.returncode == 0, inserted.stderr

    shown = _run([TTFT, "request", "req 'ü' 1"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    for text in ("missing_stage", "租户", "retrieval", "420.5", "guardrail", "missing stages: llm_ttft"):
        assert text in shown.stdout, text

    as_json = _run([TTFT, "request", "--json", "req 'ü' 1"], tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    assert record["tenant_id"] == "租户"
    assert record["llm_ttft_ms"] is None
    assert record["started_at"] == RECENT_DAY_MS + 1234.0

    by_trace = _run([TTFT, "request", "--json", "5b8efff798038103d269b633813fc60c"], tmp_path)
    assert by_trace.returncode == 0, by_trace.stderr
    assert json.loads(by_trace.stdout)["request_id"] == "req 'ü' 1"

    missing = _run([TTFT, "request", "no-such-request"], tmp_path)
    assert missing.returncode == 1
    assert "not found" in missing.stderr


def test_request_before_migrate_says_what_to_do(tmp_path: Path) -> None:
    result = _run([TTFT, "request", "x"], tmp_path)
    assert result.returncode == 1
    assert "ttft db migrate" in result.stderr


def test_request_shared_by_two_tenants_needs_tenant(tmp_path: Path) -> None:
    """Issue 14: a request is (tenant_id, request_id); the CLI asks which one when an id is shared."""
    assert _run([TTFT, "db", "migrate"], tmp_path).returncode == 0
    second = _INSERT.replace('tenant_id="租户"', 'tenant_id="other"').replace("ttft_ms=1500.0", "ttft_ms=900.0")
    for script in (_INSERT, second):
        inserted = _run([sys.executable, "-c", script], tmp_path)
        assert inserted.returncode == 0, inserted.stderr
    ambiguous = _run([TTFT, "request", "req 'ü' 1"], tmp_path)
    assert ambiguous.returncode == 1 and "pass --tenant" in ambiguous.stderr
    chosen = _run([TTFT, "request", "--json", "--tenant", "other", "req 'ü' 1"], tmp_path)
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["ttft_ms"] == 900.0
