"""Issue 13: the writer closes windows from its own copy of their records in a close process.

Through the real broker and store, with the ``ttft worker`` a user starts: historical traffic makes
windows close from the copy (``source="memory"``); ``kill -9`` of that worker leaves no process behind,
the close process included; after a restart every stored window equals a recompute from
``requests FINAL``, and every request is stored once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_pipeline_e2e import _check_store
from tests.integration.test_supervisor import _alive, _start
from tests.support.faults import read_snapshot
from tests.support.pipeline import Pipeline, pipeline_drained, pipeline_env, produce_sync
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(420)]


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        children = {child for child, parent in parents.items() if parent in frontier}
        out |= children
        frontier = children - {pid}
    return out


def test_windows_close_from_the_copy_and_kill_9_leaves_no_close_process(kafka_settings: Any, tmp_path: Path) -> None:
    # Three hours back, 6,000 requests 25 ms apart: ~3 windows of event time, closed as the join catches up.
    traffic = build_traffic(6_000, start_ms=time.time() * 1000 - 3 * 3_600_000, spacing_ms=25.0, prefix="cp")
    env = pipeline_env(kafka_settings, tmp_path, TTFT_WINDOWS__IDLE_CLOSE_S="5")
    pipe = Pipeline(env, tmp_path)
    topic = kafka_settings.topic("stage-events")
    try:
        supervisor, writer, join = _start(pipe)
        produce_sync(kafka_settings.kafka_bootstrap, topic, traffic.messages)
        memory = 'ttft_window_close_seconds_count{source="memory"}'
        pipe.wait_for(lambda: writer.metrics().get(memory, 0) >= 1, 180, "a window closed from the writer's copy")
        family = _descendants(supervisor.proc.pid)
        assert len(family) >= 3, f"expected join, writer and the close process under the supervisor: {family}"
        os.kill(supervisor.proc.pid, signal.SIGKILL)
        supervisor.proc.wait(10)
        killed_at = time.monotonic()
        while any(_alive(pid) for pid in family) and time.monotonic() - killed_at < 5.0:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in family), f"left behind after kill -9: {family}"

        supervisor, writer, join = _start(pipe)
        pipe.wait_for(lambda: pipeline_drained(kafka_settings, join), 240, "the restarted pipeline to drain")
        pipe.wait_for(lambda: writer.metric("ttft_window_jobs_queued") == 0, 60, "the queued closes")
        supervisor.proc.send_signal(signal.SIGTERM)
        assert supervisor.proc.wait(30) == 0
    finally:
        pipe.stop_all()
    _check_store(pipe, traffic)
    snapshot = read_snapshot(env)
    assert snapshot.stage_windows, "no window was stored"
    assert snapshot.recompute_differences == []
