"""The remembered-requests caps through the real broker, join and writer (tests/unit/test_join_remembered.py
on the core): a registered tenant's late stage reaches its stored row although the join's
``join.max_remembered_requests`` was passed, first by a spray of unregistered tenant ids (the pool's emitted
requests go first), then by another registered tenant's flood (the victim's requests are forgotten early; its
late events come as amendments the writer merges, also after the join was killed and restarted in between).
Before, both late stages came as one-event ``orphan`` records that lost to the stored rows: ``llm_ttft_ms``
stayed empty; and until the early-forget marks were in the changelog, so did the second after a restart."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from streams.kafka.topics import ensure_topics
from streams.ports import free_port
from streams.settings import load_settings
from tests.support.pipeline import produce_sync
from tests.support.scenarios import PipelinePair, write_config

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(300)]

CAP = 100
CONFIG: dict[str, Any] = {
    "windows": {"window_s": 5, "grace_s": 2},
    "join": {
        "request_timeout_ms": 3_000,
        "grace_ms": 500,
        "forget_after_ms": 60_000,
        "max_remembered_requests": CAP,
    },
    "rules": {"tenant_silence": {"enabled": False}},
    "tenancy": {"registered": ["victim", "victim2", "flood"], "steady_windows": 0},
}


def _event(tenant: str, rid: str, stage: str, ts: float, duration: float | None = None) -> tuple[bytes, bytes]:
    event: dict[str, Any] = {"request_id": rid, "tenant_id": tenant, "version_id": "v1", "stage": stage, "ts_ms": ts}
    if duration is not None:
        event["duration_ms"] = duration
    return rid.encode(), orjson.dumps(event)


def _requests_without_llm(tenant: str, start: float) -> list[tuple[bytes, bytes]]:
    """Five requests, each missing its llm_ttft span (it comes late)."""
    out: list[tuple[bytes, bytes]] = []
    for i in range(5):
        t = start + i * 10.0
        out += [
            _event(tenant, f"{tenant}-{i}", "request_start", t),
            _event(tenant, f"{tenant}-{i}", "retrieval", t + 5.0, 100.0),
            _event(tenant, f"{tenant}-{i}", "first_token", t + 400.0),
        ]
    return out


def _late_llm(tenant: str, start: float) -> list[tuple[bytes, bytes]]:
    return [_event(tenant, f"{tenant}-{i}", "llm_ttft", start + i * 10.0 + 150.0, 230.0) for i in range(5)]


def test_a_registered_tenants_late_stage_is_stored_past_the_remembered_cap(kafka_broker: Any, tmp_path: Path) -> None:
    kafka_broker.ensure_running()
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        kafka_bootstrap=kafka_broker.bootstrap, home=tmp_path, topic_prefix=prefix, app_id=prefix, partitions=1
    )
    asyncio.run(ensure_topics(settings))
    pair = PipelinePair.start(settings, tmp_path, TTFT_CONFIG=str(write_config(tmp_path / "ttft.yaml", CONFIG)))
    topic = settings.topic("stage-events")
    join = pair.join

    def emitted_at_least(n: int) -> bool:
        return join.metric("ttft_records_emitted_total") >= n

    def written_at_least(n: int) -> bool:
        return pair.writer.metric("ttft_records_written_total") >= n

    try:
        # 1. A spray of 300 unregistered tenants past the cap, after the victim's requests were emitted.
        start = time.time() * 1000.0
        produce_sync(settings.kafka_bootstrap, topic, _requests_without_llm("victim", start))
        pair.pipe.wait_for(lambda: emitted_at_least(5), 60, "the victim's records")
        now = time.time() * 1000.0
        spray = [_event(f"spray-{k}", f"s{k}", "request_start", now + k * 0.1) for k in range(300)]
        produce_sync(settings.kafka_bootstrap, topic, spray)
        pair.pipe.wait_for(lambda: emitted_at_least(305), 60, "the sprayed records")
        produce_sync(settings.kafka_bootstrap, topic, _late_llm("victim", start))
        pair.pipe.wait_for(lambda: emitted_at_least(310), 60, "the victim's late records")
        # 2. Another registered tenant's flood past the cap: victim2's requests are forgotten early.
        start2 = time.time() * 1000.0
        produce_sync(settings.kafka_bootstrap, topic, _requests_without_llm("victim2", start2))
        pair.pipe.wait_for(lambda: emitted_at_least(315), 60, "victim2's records")
        now = time.time() * 1000.0
        flood = [_event("flood", f"f{k}", "request_start", now + k * 0.1) for k in range(150)]
        produce_sync(settings.kafka_bootstrap, topic, flood)
        pair.pipe.wait_for(lambda: emitted_at_least(465), 60, "the flood's records")
        caps = {k: v for k, v in join.metrics().items() if k.startswith("ttft_caps_tripped_total") and v > 0}
        pool_remembered = join.metric("ttft_pool_remembered_requests")
        # 3. kill -9 of the join once its state is in the changelog (every 500 ms) and the records are stored,
        # then a new join: victim2's late events must still come as amendments.
        pair.pipe.wait_for(lambda: written_at_least(465), 60, "the flood's rows")
        time.sleep(1.5)
        assert pair.pipe.stop(join, signal.SIGKILL) == -signal.SIGKILL
        pair.join = join = pair.pipe.start("join", free_port())
        pair.pipe.wait_healthy(join)
        produce_sync(settings.kafka_bootstrap, topic, _late_llm("victim2", start2))
        pair.wait_drained(120)
        assert join.alive() and pair.writer.alive(), "a worker exited"
        pair.stop()
    finally:
        pair.pipe.stop_all()
    rows = pair.query(
        "SELECT tenant_id, request_id, llm_ttft_ms, event_count, status FROM {db}.requests FINAL "
        "WHERE tenant_id IN ('victim', 'victim2') ORDER BY tenant_id, request_id"
    )
    (counts,) = pair.query(
        "SELECT countIf(tenant_id LIKE 'spray-%') AS sprayed, countIf(tenant_id = 'flood') AS flood "
        "FROM {db}.requests FINAL"
    )
    print(f"\ncaps tripped {caps}; pool remembered at the end {pool_remembered:.0f}; rows {rows}")
    assert caps.get('ttft_caps_tripped_total{cap="remembered_requests"}', 0) > 0, caps
    assert (int(counts["sprayed"]), int(counts["flood"])) == (300, 150)
    assert len(rows) == 10, rows
    for row in rows:
        # All four events joined (prompt_assemble was never sent: missing_stage, as in one join of the four).
        assert row["llm_ttft_ms"] == 230.0 and int(row["event_count"]) == 4 and row["status"] == "missing_stage", row
