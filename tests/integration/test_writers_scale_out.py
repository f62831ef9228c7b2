"""Issue 13: two writers over split partitions of one store give the windows and alert transitions of one
writer, and each window is judged by one rule engine, once.

The traffic (canary-regression, three hours back, so alerts fire and every window closes) is joined once
by a real ``ttft worker --role join``; its ``ttft.requests`` topic then feeds two configurations, each in a
subprocess of its own with its own store and consumer group: one writer, and two writers in one process
(:mod:`tests.support.writers_run`; chDB allows one process per store, so this is how two writer pods on
one ClickHouse server are run here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.ports import free_port
from tests.support.faults import canary_traffic
from tests.support.pipeline import REPO, Pipeline, pipeline_env, produce_sync

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(600)]


def _writers(settings: Any, home: Path, app: str, count: int) -> dict[str, Any]:
    env = pipeline_env(settings, home, TTFT_APP_ID=app, TTFT_PAGING_MUTED="true")
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.writers_run", str(count)],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=400,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()[-4000:]
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


def test_two_writers_over_split_partitions_equal_one_writer(kafka_settings: Any, tmp_path: Path) -> None:
    traffic = canary_traffic(rate_rps=15.0, duration_s=360.0)
    for name in ("join", "one", "two"):
        (tmp_path / name).mkdir()
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path / "join"), tmp_path / "join")
    try:
        join = pipe.start("join", free_port())
        pipe.wait_healthy(join)
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), traffic.messages)
        pipe.wait_for(
            lambda: (
                join.metric("ttft_events_consumed_total") > 0
                and join.metric("ttft_open_requests") == 0
                and _join_done(kafka_settings)
            ),
            240,
            "the join to finish the traffic",
        )
    finally:
        pipe.stop_all()
    one = _writers(kafka_settings, tmp_path / "one", "one", 1)
    two = _writers(kafka_settings, tmp_path / "two", "two", 2)
    print(
        f"\nowned: one {one['owned']}, two {two['owned']}; {len(one['stage_windows'])} stage rows; "
        f"{len(one['alerts'])} alert transitions; windows judged: one {len(one['evaluated'][0])}, "
        f"two {[len(e) for e in two['evaluated']]}"
    )
    assert one["requests"] == two["requests"] > 0
    assert len(two["owned"]) == 2 and all(two["owned"])
    assert one["stage_windows"] and two["stage_windows"] == one["stage_windows"]
    assert two["window_health"] == one["window_health"]
    assert one["alerts"] and two["alerts"] == one["alerts"]
    # One rule engine judged every window, once: the owner's list is the single writer's, the other's empty.
    judged = sorted(w for evaluated in two["evaluated"] for w in evaluated)
    alone = one["evaluated"][0]
    assert len(set(judged)) == len(judged), "a window was judged twice"
    # The same windows from the same start; the run's end (wall clock) may add an empty window or two.
    common = min(len(judged), len(alone))
    assert common > 0 and judged[:common] == alone[:common] and abs(len(judged) - len(alone)) <= 2
    assert sum(1 for evaluated in two["evaluated"] if evaluated) == 1


def _join_done(settings: Any) -> bool:
    from tests.support.pipeline import group_lag

    return (
        group_lag(settings.kafka_bootstrap, f"app-{settings.topic_prefix}-join", [settings.topic("stage-events")]) == 0
    )
