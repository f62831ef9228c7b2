"""Issue 14 item 1: ``kill -9`` of the ``ttft worker`` supervisor leaves no orphan, and a restarted worker
stores every request exactly once and stops within 15 s of SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streams.kafka.broker import LocalBroker, missing_prerequisite
from streams.kafka.topics import ensure_topics
from streams.ports import free_ports
from streams.settings import load_settings
from tests.integration.test_pipeline_e2e import _check_store
from tests.support.pipeline import Pipeline, WorkerProcess, pipeline_drained, pipeline_env, produce_sync
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(420)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state  # a zombie has exited


def _children(home: Path) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in (home / "run").glob("*.json")]


def _start(pipe: Pipeline) -> tuple[WorkerProcess, WorkerProcess, WorkerProcess]:
    """(supervisor, its writer's metrics, its join's metrics)."""
    port = free_ports(2)[0]  # the supervisor gives the writer port and the join port + 1
    supervisor = pipe.start("all", port)
    writer = WorkerProcess("writer", supervisor.proc, port, supervisor.log_path)
    join = WorkerProcess("join", supervisor.proc, port + 1, supervisor.log_path)
    pipe.wait_healthy(writer)
    pipe.wait_healthy(join)
    return supervisor, writer, join


def test_kill_9_of_the_supervisor_leaves_no_orphan_and_loses_nothing(kafka_settings: Any, tmp_path: Path) -> None:
    traffic = build_traffic(4_000, start_ms=time.time() * 1000 - 60_000, spacing_ms=2.0, prefix="sup")
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    topic = kafka_settings.topic("stage-events")
    try:
        supervisor, _, join = _start(pipe)
        children = _children(tmp_path)
        assert len(children) == 2 and supervisor.proc.pid not in children
        half = len(traffic.messages) // 2

        def _produce() -> None:
            for i in range(0, len(traffic.messages), 1_000):
                produce_sync(kafka_settings.kafka_bootstrap, topic, traffic.messages[i : i + 1_000])
                time.sleep(0.05)

        producer = threading.Thread(target=_produce, daemon=True)
        producer.start()
        pipe.wait_for(lambda: join.metric("ttft_events_consumed_total") >= half, 120, "half the traffic consumed")
        os.kill(supervisor.proc.pid, signal.SIGKILL)
        supervisor.proc.wait(10)
        killed_at = time.monotonic()
        while any(_alive(pid) for pid in children) and time.monotonic() - killed_at < 5.0:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed_at
        assert not any(_alive(pid) for pid in children), f"orphans after {gone_after:.1f} s: {children}"
        print(f"\nchildren gone {gone_after:.2f} s after kill -9 of the supervisor")
        producer.join(120)

        supervisor, _, join = _start(pipe)
        pipe.wait_for(lambda: pipeline_drained(kafka_settings, join), 240, "the restarted pipeline to drain")
        sent = time.monotonic()
        supervisor.proc.send_signal(signal.SIGTERM)
        rc = supervisor.proc.wait(30)
        stopped_in = time.monotonic() - sent
        print(f"restarted worker stopped {stopped_in:.2f} s after SIGTERM (rc {rc})")
        assert stopped_in < 15.0 and rc == 0
        assert not any(_alive(pid) for pid in _children(tmp_path))
    finally:
        pipe.stop_all()
    _check_store(pipe, traffic)


def test_sigterm_stops_the_worker_in_bounded_time_with_the_broker_gone(tmp_path: Path) -> None:
    """The broker is stopped first: the children cannot leave their groups or flush, yet `ttft worker`
    exits within 15 s of SIGTERM (it kills what is still running after ``stop_timeout_s``)."""
    if reason := missing_prerequisite():
        pytest.skip(f"no local Kafka broker: {reason}")
    broker = LocalBroker(tmp_path / "broker", heap_mb=384, jvm_options=["-XX:TieredStopAtLevel=1"])
    broker.start()
    try:
        settings = load_settings(kafka_bootstrap=broker.bootstrap, home=tmp_path, topic_prefix="gone", app_id="gone")
        asyncio.run(ensure_topics(settings))
        pipe = Pipeline(pipeline_env(settings, tmp_path / "home"), tmp_path)
        try:
            supervisor, _, _ = _start(pipe)
            children = _children(tmp_path / "home")
            assert broker.stop(timeout_s=20)
            sent = time.monotonic()
            supervisor.proc.send_signal(signal.SIGTERM)
            rc = supervisor.proc.wait(30)
            stopped_in = time.monotonic() - sent
            print(f"\nworker stopped {stopped_in:.2f} s after SIGTERM with the broker gone (rc {rc})")
            assert stopped_in < 15.0
            deadline = time.monotonic() + 5
            while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(_alive(pid) for pid in children)
        finally:
            pipe.stop_all()
    finally:
        broker.stop(timeout_s=10)
