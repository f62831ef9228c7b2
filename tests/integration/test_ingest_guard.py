"""The dead-letter guard through the real broker: a flood of invalid input quarantines its source (a tenant,
or the producer of bytes without one) and pages once; ingestion never halts for everyone (issues 14, 27)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from streams.alerting.outbox import DeliveryState
from streams.ports import free_port
from tests.support.pipeline import Pipeline, group_lag, pipeline_env, produce_sync, read_topic
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.clickhouse]


async def _produce_to_partition(
    bootstrap: str, topic: str, partition: int, values: list[bytes], producer_name: bytes | None = None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    headers = [("ttft-producer", producer_name)] if producer_name is not None else None
    await producer.start()
    try:
        pending = [
            await producer.send(topic, value, key=b"bad", partition=partition, headers=headers) for value in values
        ]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def test_unparseable_flood_on_one_partition_is_quarantined_and_every_tenant_keeps_flowing(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """Issue 27 item 4: 2,000 unparseable messages on one partition used to halt the join for every tenant
    (and the restart halted again on them). Now their producer is quarantined and paged once, they are
    dead-lettered, and the other tenants' requests are stored with the process running."""
    good = build_traffic(300, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_CAPS__HALT_WINDOW_MESSAGES="500",
        TTFT_CAPS__HALT_DEAD_LETTER_SHARE="0.5",
    )
    pipe = Pipeline(env, tmp_path)
    topic, bootstrap = kafka_settings.topic("stage-events"), kafka_settings.kafka_bootstrap
    app = f"app-{kafka_settings.topic_prefix}"
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        asyncio.run(_produce_to_partition(bootstrap, topic, 3, [b"{not json at all"] * 1_000))
        produce_sync(bootstrap, topic, good.messages)
        asyncio.run(_produce_to_partition(bootstrap, topic, 3, [b"\x00\xffgarbage"] * 1_000))
        pipe.wait_for(lambda: group_lag(bootstrap, f"{app}-join", [topic]) == 0, 120, "the join to drain")
        # Read is not yet emitted: the last requests finish on the join's idle tick, after the lag is 0.
        pipe.wait_for(lambda: join.metric("ttft_open_requests") == 0, 120, "the join to emit every request")
        writer_topics = [kafka_settings.topic("requests"), kafka_settings.topic("dead-letter")]
        pipe.wait_for(lambda: group_lag(bootstrap, f"{app}-writer", writer_topics) == 0, 120, "the writer to drain")
        assert join.alive() and writer.alive(), join.log()[-3000:]
        metrics = join.metrics()
        assert metrics['ttft_caps_tripped_total{cap="producer_quarantine"}'] == 1
        assert metrics['ttft_quarantined_sources{kind="producer"}'] == 1
        letters = {k: v for k, v in metrics.items() if k.startswith("ttft_dead_letters_total")}
        assert sum(letters.values()) == 2_000 and letters['ttft_dead_letters_total{reason="invalid_json"}'] >= 1_000
        assert "partition 3 (no producer header) quarantined" in join.log()
        assert "TTFTIngestHalted" not in join.log()
        with urllib.request.urlopen(f"http://127.0.0.1:{join.port}/healthz", timeout=5) as resp:
            health = orjson.loads(resp.read())
        assert [q["source"] for q in health["quarantined_sources"]] == ["partition 3 (no producer header)"]
        status = subprocess.run(
            [sys.executable, "-m", "streams.cli.main", "rules", "status"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert "QUARANTINED partition 3 (no producer header) since" in status.stdout, status.stdout + status.stderr
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    raw = asyncio.run(read_topic(bootstrap, kafka_settings.topic("alerts")))
    pages = [orjson.loads(value) for _, value in raw]
    assert [(p["alertname"], p["state"], p["labels"]["source"]) for p in pages] == [
        ("TTFTSourceQuarantined", "firing", "partition 3 (no producer header)")
    ]
    stored = pipe.query("SELECT request_id, status, ttft_ms FROM {db}.requests FINAL")
    assert {r["request_id"]: r["status"] for r in stored} == {rid: t["status"] for rid, t in good.truth.items()}
    (letters,) = pipe.query("SELECT count() AS n FROM {db}.dead_letters FINAL WHERE source_partition = 3")
    assert int(letters["n"]) == 2_000  # nothing lost


def test_a_quarantine_survives_a_join_killed_and_restarted_and_its_page_fires_once_and_resolves_once(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """Issue 27 item 4's loose end: a quarantine lived in the join's memory, so after a kill -9 its page kept
    firing with nothing behind it, and the next flood paged again. Now the restarted join holds it again
    from its claim on ttft.alerts: /healthz and `ttft rules status` show it, the flood goes on without a
    second page, and once the producer is fixed the page resolves, once."""
    good = build_traffic(300, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_CAPS__HALT_WINDOW_MESSAGES="500",
        TTFT_CAPS__HALT_DEAD_LETTER_SHARE="0.5",
        TTFT_CAPS__QUARANTINE_RELEASE_MESSAGES="1000",
    )
    pipe = Pipeline(env, tmp_path)
    topic, bootstrap = kafka_settings.topic("stage-events"), kafka_settings.kafka_bootstrap
    group = f"app-{kafka_settings.topic_prefix}-join"
    source = "partition 3 (no producer header)"

    def transitions() -> list[tuple[str, str]]:
        raw = asyncio.run(read_topic(bootstrap, kafka_settings.topic("alerts")))
        return [(p["state"], p["labels"]["source"]) for p in (orjson.loads(v) for _, v in raw)]

    def health(join: Any) -> list[Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{join.port}/healthz", timeout=5) as resp:
            return [q["source"] for q in orjson.loads(resp.read())["quarantined_sources"]]

    def drained() -> None:
        pipe.wait_for(lambda: group_lag(bootstrap, group, [topic]) == 0, 120, "the join to drain")

    try:
        join = pipe.start("join", free_port())
        pipe.wait_healthy(join)
        asyncio.run(_produce_to_partition(bootstrap, topic, 3, [b"{not json at all"] * 600))
        drained()
        assert transitions() == [("firing", source)] and health(join) == [source]
        join.proc.send_signal(signal.SIGKILL)
        join.proc.wait(10)

        again = pipe.start("join", free_port())
        pipe.wait_healthy(again)
        assert health(again) == [source], again.log()[-3000:]  # held again, from its claim
        asyncio.run(_produce_to_partition(bootstrap, topic, 3, [b"\x00\xffgarbage"] * 600))  # still broken
        drained()
        assert transitions() == [("firing", source)]  # no second page
        assert again.metric("ttft_caps_tripped_total") == 0  # held, not judged again
        status = subprocess.run(
            [sys.executable, "-m", "streams.cli.main", "rules", "status"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert f"QUARANTINED {source} since" in status.stdout, status.stdout + status.stderr
        produce_sync(bootstrap, topic, good.messages)  # fixed: clean messages release it
        drained()
        pipe.wait_for(lambda: health(again) == [], 60, "the quarantine to be released")
        assert transitions() == [("firing", source), ("resolved", source)]
        assert pipe.stop(again) == 0
    finally:
        pipe.stop_all()


def _owned(worker: Any) -> set[int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.port}/healthz", timeout=2) as resp:
        body = orjson.loads(resp.read())
    return set(body.get("partitions") or ()) if body.get("status") == "ok" else set()


def test_two_join_workers_quarantining_one_producer_page_once_and_a_kill_hands_the_claim_over(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """Item 2: join workers A and B (four partitions each) both quarantine producer 'svc' (it floods one
    partition of each): one alert, paged once (its identity is the source, not the worker). A is killed;
    B takes A's partitions and their claim, so the page neither resolves nor fires again, and once the
    producer is fixed it resolves once."""
    good = build_traffic(400, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_CAPS__HALT_WINDOW_MESSAGES="500",
        TTFT_CAPS__HALT_DEAD_LETTER_SHARE="0.5",
        TTFT_CAPS__QUARANTINE_RELEASE_MESSAGES="1000",
    )
    pipe = Pipeline(env, tmp_path)
    topic, bootstrap = kafka_settings.topic("stage-events"), kafka_settings.kafka_bootstrap
    group = f"app-{kafka_settings.topic_prefix}-join"
    everyone = set(range(kafka_settings.partitions))

    def told() -> list[tuple[str, str]]:
        """What the alert delivery tells Alertmanager, folding ttft.alerts as it does."""
        state = DeliveryState()
        for _, value in asyncio.run(read_topic(bootstrap, kafka_settings.topic("alerts"))):
            state.fold_message(value)
        return sorted((d.transition.state, d.transition.labels["source"]) for d in state.due(0.0, 60.0))

    def drained() -> None:
        pipe.wait_for(lambda: group_lag(bootstrap, group, [topic]) == 0, 120, "the joins to drain")

    try:
        a = pipe.start("join", free_port(), worker_id="join-a")
        b = pipe.start("join", free_port(), worker_id="join-b")
        pipe.wait_healthy(a)
        pipe.wait_healthy(b)
        pipe.wait_for(lambda: _owned(a) and _owned(b) and _owned(a) | _owned(b) == everyone, 90, "a split")
        on_a, on_b = min(_owned(a)), min(_owned(b))
        for partition in (on_a, on_b):
            asyncio.run(_produce_to_partition(bootstrap, topic, partition, [b"{broken"] * 600, b"svc"))
        drained()
        raw = [orjson.loads(v) for _, v in asyncio.run(read_topic(bootstrap, kafka_settings.topic("alerts")))]
        assert sorted(int(m["claim"]["holder"]) for m in raw) == sorted((on_a, on_b))
        assert {m["fingerprint"] for m in raw} == {raw[0]["fingerprint"]}  # one alert, two holders
        assert told() == [("firing", "producer 'svc'")]

        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
        pipe.wait_for(lambda: _owned(b) == everyone, 90, "B to take A's partitions")
        with urllib.request.urlopen(f"http://127.0.0.1:{b.port}/healthz", timeout=5) as resp:
            held = orjson.loads(resp.read())["quarantined_sources"]
        assert sorted(p for q in held for p in q["partitions"]) == sorted((on_a, on_b)), held
        assert told() == [("firing", "producer 'svc'")]  # handed over: not resolved, not paged again
        produce_sync(bootstrap, topic, good.messages)  # fixed
        drained()
        pipe.wait_for(lambda: told() == [("resolved", "producer 'svc'")], 60, "the page to resolve")
        assert pipe.stop(b) == 0
    finally:
        pipe.stop_all()


def test_one_tenants_bad_deploy_is_quarantined_and_everyone_else_keeps_flowing(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """Issue 14 item 7: the same flood, but from one tenant: quarantine it, never halt the others."""
    good = build_traffic(300, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    bad_event = {"request_id": "x", "tenant_id": "bad-deploy", "stage": "retrieval", "ts_ms": time.time() * 1000}
    flood = [
        (f"x{i}".encode(), orjson.dumps({**bad_event, "request_id": f"x{i}", "duration_ms": -1.0}))
        for i in range(1_500)
    ]
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_CAPS__HALT_WINDOW_MESSAGES="500",
        TTFT_CAPS__HALT_DEAD_LETTER_SHARE="0.5",
    )
    pipe = Pipeline(env, tmp_path)
    topic = kafka_settings.topic("stage-events")
    try:
        join = pipe.start("join", free_port())
        pipe.wait_healthy(join)
        produce_sync(kafka_settings.kafka_bootstrap, topic, flood)
        produce_sync(kafka_settings.kafka_bootstrap, topic, good.messages)
        group = f"app-{kafka_settings.topic_prefix}-join"
        pipe.wait_for(lambda: group_lag(kafka_settings.kafka_bootstrap, group, [topic]) == 0, 120, "the join to drain")
        assert join.alive(), join.log()[-3000:]
        metrics = join.metrics()
        assert metrics['ttft_caps_tripped_total{cap="tenant_quarantine"}'] == 1
        assert metrics.get('ttft_caps_tripped_total{cap="producer_quarantine"}', 0) == 0
        assert metrics['ttft_dead_letters_total{reason="schema"}'] == 1_500
        assert "tenant 'bad-deploy' quarantined" in join.log()
        assert pipe.stop(join) == 0
    finally:
        pipe.stop_all()


def test_a_store_refusing_every_insert_pages_ttft_ingest_halted_and_resolves_when_it_accepts_again(
    kafka_settings: Any, tmp_path: Path
) -> None:
    """The one global halt left (issue 27): the writer holds everything uncommitted while the store refuses
    every call, pages TTFTIngestHalted after caps.store_halt_page_s, and resolves it once inserts pass."""
    good = build_traffic(50, start_ms=time.time() * 1000 - 60_000, malformed_share=0.0, dup_share=0.0)
    down = tmp_path / "store-down"
    env = pipeline_env(kafka_settings, tmp_path, TTFT_CAPS__STORE_HALT_PAGE_S="3", TTFT_FAULT_STORE_FAIL_FILE=str(down))
    pipe = Pipeline(env, tmp_path)
    bootstrap, alerts_topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("alerts")
    app = f"app-{kafka_settings.topic_prefix}"
    writer_topics = [kafka_settings.topic("requests"), kafka_settings.topic("dead-letter")]

    def pages() -> list[tuple[str, str]]:
        raw = asyncio.run(read_topic(bootstrap, alerts_topic))
        transitions = (orjson.loads(v) for _, v in raw)
        return [(a["alertname"], a["state"]) for a in transitions if a["alertname"] == "TTFTIngestHalted"]

    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        down.touch()
        produce_sync(bootstrap, kafka_settings.topic("stage-events"), good.messages)
        pipe.wait_for(lambda: ("TTFTIngestHalted", "firing") in pages(), 90, "the halt to be paged")
        assert group_lag(bootstrap, f"{app}-writer", writer_topics) > 0  # nothing committed meanwhile
        assert writer.alive() and "TTFTIngestHalted: the store has refused every call" in writer.log()
        down.unlink()
        pipe.wait_for(lambda: join.metric("ttft_open_requests") == 0, 120, "the join to emit every request")
        pipe.wait_for(lambda: group_lag(bootstrap, f"{app}-writer", writer_topics) == 0, 120, "the writer to drain")
        pipe.wait_for(lambda: ("TTFTIngestHalted", "resolved") in pages(), 30, "the halt to resolve")
        assert pipe.stop(join) == 0 and pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    assert pages() == [("TTFTIngestHalted", "firing"), ("TTFTIngestHalted", "resolved")]
    stored = pipe.query("SELECT count() AS n FROM {db}.requests FINAL")
    assert int(stored[0]["n"]) == len(good.truth)
