"""Issue 8, scale-out: two join workers share 8 partitions; one is killed with -9 mid-stream.

Its partitions must move to the survivor within 30 s (the workers run with TTFT_SESSION_TIMEOUT_S=6), and
the store must hold exactly the ground truth afterwards: nothing lost, nothing double-counted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.ports import free_port
from tests.integration.test_pipeline_e2e import _check_store
from tests.support.pipeline import Pipeline, WorkerProcess, group_lag, pipeline_env, produce_sync
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

N_REQUESTS = 10_000
MOVE_BUDGET_S = 30.0


def owned_partitions(worker: WorkerProcess) -> set[int]:
    """The stage-events partitions a join worker reports on /healthz (empty while it is not ready)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/healthz", timeout=2) as resp:
        body = json.loads(resp.read())
    return set(body.get("partitions") or ()) if body.get("status") == "ok" else set()


async def _partition_lags(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: ends[tp] - max(committed[tp].offset if tp in committed else 0, 0) for tp in tps}
    finally:
        await consumer.stop()
        await admin.close()


def partition_lags(settings: Any) -> dict[int, int]:
    """Uncommitted events of the join group per stage-events partition (end offset - committed offset)."""
    group = f"app-{settings.topic_prefix}-join"
    topic = settings.topic("stage-events")
    return asyncio.run(_partition_lags(settings.kafka_bootstrap, group, topic, settings.partitions))


class DrainStalled(AssertionError):
    """The pipeline made no progress for the allowed time (or ran out of time) with work left."""


def wait_drained(pipe: Pipeline, settings: Any, join: WorkerProcess, stall_s: float, cap_s: float) -> None:
    """Wait until the join and the writer committed everything and nothing is open.

    Slow progress is fine (2 shared cores may run a join worker at a few hundred events/s); no progress in
    ``stall_s`` fails at once, with the numbers, so a stuck pipeline is told apart from a slow one.
    """
    app = f"app-{settings.topic_prefix}"
    b = settings.kafka_bootstrap
    start = progressed_at = time.monotonic()
    lowest: list[float] = []
    while True:
        join_lag = group_lag(b, f"{app}-join", [settings.topic("stage-events")])
        writer_lag = group_lag(b, f"{app}-writer", [settings.topic("requests"), settings.topic("dead-letter")])
        open_requests = join.metric("ttft_open_requests")
        if (join_lag, writer_lag, open_requests) == (0, 0, 0):
            return
        # Progress: a lag or the open count reaches a new low, or the join consumes more events.
        state = (join_lag, writer_lag, open_requests, -join.metric("ttft_events_consumed_total"))
        now = time.monotonic()
        if not lowest or any(v < low for v, low in zip(state, lowest, strict=True)):
            progressed_at = now
            lowest = [min(v, low) for v, low in zip(state, lowest or state, strict=True)]
        if now - progressed_at >= stall_s or now - start >= cap_s:
            logs = "\n".join(f"--- {w.role}:{w.port}\n{w.log()[-2000:]}" for w in pipe.workers)
            raise DrainStalled(
                f"not drained after {now - start:.0f} s, no progress for {now - progressed_at:.0f} s: join lag "
                f"{join_lag}, writer lag {writer_lag}, open requests {open_requests:.0f}, events consumed by "
                f"the survivor {-state[3]:.0f}\n{logs}"
            )
        time.sleep(2)


@pytest.mark.timeout(900)
def test_killed_join_worker_partitions_move_to_survivor(
    kafka_settings: Any, tmp_path: Path, record_property: Any
) -> None:
    traffic = build_traffic(N_REQUESTS, start_ms=time.time() * 1000 - 60_000, spacing_ms=2.0, prefix="scale")
    all_partitions = set(range(kafka_settings.partitions))
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    topic = kafka_settings.topic("stage-events")
    total = len(traffic.messages)
    try:
        writer = pipe.start("writer", free_port())
        victim = pipe.start("join", free_port(), worker_id="join-a")
        survivor = pipe.start("join", free_port(), worker_id="join-b")
        for worker in (writer, victim, survivor):
            pipe.wait_healthy(worker)

        def _split() -> bool:
            mine, theirs = owned_partitions(victim), owned_partitions(survivor)
            return bool(mine) and bool(theirs) and not mine & theirs and mine | theirs == all_partitions

        pipe.wait_for(_split, 90, "both join workers to own a share of the partitions")
        split = (sorted(owned_partitions(victim)), sorted(owned_partitions(survivor)))

        # Paced so that the kill lands mid-stream and the survivor still has work arriving afterwards.
        chunk = 2_000

        def _produce() -> None:
            for i in range(0, total, chunk):
                produce_sync(kafka_settings.kafka_bootstrap, topic, traffic.messages[i : i + chunk])
                time.sleep(0.15)

        producer = threading.Thread(target=_produce, daemon=True)
        producer.start()

        at_kill: dict[str, float] = {}

        def _kill_point() -> bool:
            consumed = [w.metric("ttft_events_consumed_total") for w in (victim, survivor)]
            at_kill.update(consumed=sum(consumed), victim_open=victim.metric("ttft_open_requests"))
            # Early enough that most of the stream is still to come, late enough that the victim holds
            # open requests (state the survivor must recover from the changelog).
            return min(consumed) > 0 and sum(consumed) >= total * 0.15 and at_kill["victim_open"] > 0

        pipe.wait_for(_kill_point, 180, "both join workers consuming, 15 % of the events consumed")
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.proc.wait(10)
        pipe.wait_for(
            lambda: owned_partitions(survivor) == all_partitions, MOVE_BUDGET_S + 30, "the partitions to move"
        )
        move_s = time.monotonic() - killed_at
        record_property("partition_move_seconds", round(move_s, 2))
        print(
            f"\nsplit {split}; killed after {at_kill['consumed']:.0f}/{total} events consumed with "
            f"{at_kill['victim_open']:.0f} requests open on the victim; all partitions on the survivor "
            f"{move_s:.1f} s after the kill"
        )

        producer.join(180)
        assert not producer.is_alive()
        try:
            wait_drained(pipe, kafka_settings, survivor, stall_s=120, cap_s=600)
        except DrainStalled as stalled:
            stuck = {p: lag for p, lag in partition_lags(kafka_settings).items() if lag}
            raise AssertionError(f"{stalled}\nuncommitted events per partition: {stuck}") from stalled
        drained_s = time.monotonic() - killed_at
        record_property("drained_after_kill_seconds", round(drained_s, 2))
        print(f"drained {drained_s:.1f} s after the kill")
        assert pipe.stop(survivor) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    assert move_s <= MOVE_BUDGET_S, f"partitions moved after {move_s:.1f} s"
    _check_store(pipe, traffic)
