"""Issue 8: `ttft replay` re-processes a run into the same tables and changes nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streams.ports import free_port
from tests.support.pipeline import REPO, Pipeline, group_lag, pipeline_env, produce_sync
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

SNAPSHOT_QUERIES = {
    "requests": "SELECT * EXCEPT (inserted_at, amendment_ids) FROM {db}.requests FINAL ORDER BY request_id",
    "stage_windows": (
        "SELECT window_start, tenant_id, version_id, stage, count, bins, zero_count, slo_bad_count "
        "FROM {db}.stage_windows FINAL ORDER BY window_start, tenant_id, version_id, stage"
    ),
    "window_health": (
        "SELECT window_start, tenant_id, version_id, total, complete, missing_stage, timed_out, orphan "
        "FROM {db}.window_health FINAL ORDER BY window_start, tenant_id, version_id"
    ),
    "alerts": "SELECT fingerprint, state, event_at FROM {db}.alerts FINAL ORDER BY fingerprint, state, event_at",
    "dead_letters": (
        "SELECT source_partition, source_offset, reason_code FROM {db}.dead_letters FINAL "
        "ORDER BY source_partition, source_offset"
    ),
}


_LAST: dict[str, float] = {}


def _remember(state: dict[str, float]) -> bool:
    _LAST.clear()
    _LAST.update(state)
    print("drain state", state, flush=True)
    return False


def _snapshot(pipe: Pipeline) -> dict[str, list[dict[str, Any]]]:
    return {name: pipe.query(sql) for name, sql in SNAPSHOT_QUERIES.items()}


def test_replay_of_a_run_leaves_every_table_unchanged(kafka_settings: Any, tmp_path: Path) -> None:
    # Historical event time, so every window closes once the stream is idle.
    traffic = build_traffic(10_000, start_ms=(time.time() - 3 * 3600) * 1000, spacing_ms=60.0)
    env = pipeline_env(kafka_settings, tmp_path)
    pipe = Pipeline(env, tmp_path)
    settings = kafka_settings
    app = env["TTFT_APP_ID"]
    produced_from_ms = int(time.time() * 1000) - 1_000
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        produce_sync(settings.kafka_bootstrap, settings.topic("stage-events"), traffic.messages)

        def drained() -> dict[str, float] | bool:
            b = settings.kafka_bootstrap
            state = {
                "join_lag": group_lag(b, f"{app}-join", [settings.topic("stage-events")]),
                "open": join.metric("ttft_open_requests"),
                "writer_lag": group_lag(
                    b, f"{app}-writer", [settings.topic("requests"), settings.topic("dead-letter")]
                ),
                "open_windows": writer.metric("ttft_open_windows"),
                "closed": writer.metric("ttft_windows_closed_total"),
            }
            done = not (state["join_lag"] or state["open"] or state["writer_lag"] or state["open_windows"])
            return (done and state["closed"] > 0) or (False if done else {} or False) or _remember(state)

        pipe.wait_for(drained, 480, "the first run to drain")
        assert pipe.stop(join) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    before = _snapshot(pipe)
    assert len(before["requests"]) == len(traffic.truth)
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", "replay", "--from-time", str(produced_from_ms), "--timeout", "300"],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=400,
        check=False,
    )
    replay_s = time.monotonic() - started
    assert out.returncode == 0, out.stdout.decode()[-2000:] + out.stderr.decode()[-3000:]
    assert "paging muted" in out.stdout.decode()
    after = _snapshot(pipe)
    for name in SNAPSHOT_QUERIES:
        assert after[name] == before[name], f"{name} changed by the replay"
    print(f"replayed {len(traffic.messages)} events in {replay_s:.1f}s; {len(before['requests'])} requests unchanged")
