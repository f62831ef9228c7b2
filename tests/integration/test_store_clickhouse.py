from __future__ import annotations

import base64
import hashlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from schemas.dead_letter import make_dead_letter
from schemas.events import StageEvent
from schemas.records import record_version
from streams.core.join import RequestJoin, merge_records
from streams.settings import JoinConfig, Settings
from streams.store.client import StoreConfigError, make_client
from streams.store.dead_letter_store import count_dead_letters, fetch_dead_letters, insert_dead_letters
from streams.store.migrate import apply_migrations, load_migrations
from streams.store.requests_store import (
    apply_amendments,
    count_requests,
    fetch_request,
    fetch_requests,
    fetch_window_records,
    insert_requests,
    store_form,
)
from streams.store.stats_store import insert_stats, stat_sample
from tests.support.recent import RECENT_DAY_MS
from tests.support.records import make_record

pytestmark = pytest.mark.clickhouse

W = 60_000
T0 = float(RECENT_DAY_MS)  # a window boundary inside the retention TTLs


def full_record(request_id: str, tenant_id: str) -> dict[str, Any]:
    return make_record(
        request_id,
        tenant_id=tenant_id,
        version_id="v2 'canary' ✓",
        rollout="canary",
        route="fast",
        fallback_level=2,
        first_token_at=T0 + 1_234 + 1_500,
        ttft_ms=1_500.0,
        retrieval_ms=400.25,
        vector_recall_ms=210.5,
        bm25_recall_ms=190.125,
        rerank_ms=80.0,
        prompt_assemble_ms=120.0,
        llm_ttft_ms=900.0,
        other_ms=79.75,
        custom_stages={"guardrail": 12.5, "safety_check": 0.0},
        stage_repeats={"retrieval": 1, "guardrail": 2},
        recall_mode="parallel",
        prompt_tokens=4_096,
        cached_tokens=1_024,
        prompt_cache_hit=True,
        draft_accept_rate=0.625,
        rerank_top_k=20,
        retrieval_cache_hit=False,
        trace_id="0af7651916cd43dd8448eb211c80319c",
        duplicate_events=3,
        late_events=1,
        event_count=9,
    )


def test_migrations_from_empty_twice(ch_client: Client) -> None:
    database = f"m_{uuid.uuid4().hex[:12]}"
    try:
        first = apply_migrations(ch_client, database)
        assert first == [m.name for m in load_migrations()]
        assert {"0001_requests", "0002_dead_letters", "0005_pipeline_stats"} <= set(first)
        assert apply_migrations(ch_client, database) == []
        tables = {row[0] for row in ch_client.query(f"SHOW TABLES FROM {database}").result_rows}
        assert {"requests", "dead_letters", "pipeline_stats", "schema_migrations"} <= tables
        engine = ch_client.query(
            "SELECT engine, sorting_key, partition_key FROM system.tables WHERE database = {d:String}"
            " AND name = 'requests'",
            parameters={"d": database},
        ).result_rows
        assert engine == [("ReplacingMergeTree", "tenant_id, request_id", "")]  # migration 0008
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS {database} SYNC")


def test_records_round_trip_exactly(ch_client: Client, ch_database: str) -> None:
    records = [
        full_record("it's a \"quoted\" id'); DROP TABLE requests; --", "租户-é ü 🚀"),
        full_record("{param:String} %(x)s \\ back\\slash", "tenant with spaces"),
        make_record("sparse", status="missing_stage", missing_stages=["retrieval", "llm_ttft"]),
        make_record("orphan-1", status="orphan", started_at=T0 + 59_999.0, event_count=1),
        make_record("timed-out", status="timed_out", tenant_id="Ωmega", rollout="stable", event_count=2),
    ]
    insert_requests(ch_client, ch_database, records)
    stored = fetch_requests(ch_client, ch_database, [r["request_id"] for r in records] + ["absent"])
    assert stored == {r["request_id"]: r for r in records}
    assert stored["sparse"]["retrieval_ms"] is None  # NULL, never 0
    assert fetch_request(ch_client, ch_database, "absent") is None
    assert count_requests(ch_client, ch_database) == len(records)


def test_replays_and_older_versions_never_double_count(ch_client: Client, ch_database: str) -> None:
    ids = [f"req-{i}" for i in range(50)]
    complete = [full_record(i, "acme") for i in ids]
    partial = [make_record(i, status="timed_out", event_count=3) for i in ids]
    orphan = [make_record(i, status="orphan", event_count=9) for i in ids]  # same events, worse status
    insert_requests(ch_client, ch_database, partial)
    insert_requests(ch_client, ch_database, complete)
    insert_requests(ch_client, ch_database, complete[10:30])  # re-batched replay
    insert_requests(ch_client, ch_database, partial[::-1])  # an older version arriving late
    insert_requests(ch_client, ch_database, orphan)
    raw = ch_client.query(f"SELECT count() FROM {ch_database}.requests").result_rows[0][0]
    assert raw == 50 + 50 + 20 + 50 + 50
    assert count_requests(ch_client, ch_database) == 50
    assert fetch_requests(ch_client, ch_database, ids) == {r["request_id"]: r for r in complete}
    ch_client.command(f"OPTIMIZE TABLE {ch_database}.requests FINAL")
    raw = ch_client.query(f"SELECT count() FROM {ch_database}.requests").result_rows[0][0]
    assert raw == 50


def test_window_reads_see_only_the_latest_version(ch_client: Client, ch_database: str) -> None:
    moved_v1 = make_record("moved", status="orphan", started_at=T0 + W + 5.0, event_count=2)
    moved_v2 = make_record("moved", started_at=T0 + 5.0, event_count=6)  # a late request_start
    others = [make_record(f"w{i}", tenant_id=f"t{i}", started_at=T0 + W + i) for i in range(3)]
    insert_requests(ch_client, ch_database, [moved_v1, *others])
    insert_requests(ch_client, ch_database, [moved_v2])
    assert fetch_window_records(ch_client, ch_database, T0 + W, W) == others
    assert fetch_window_records(ch_client, ch_database, T0, W) == [moved_v2]
    assert fetch_window_records(ch_client, ch_database, T0 + 2 * W, W) == []


def _late_llm_ttft(request_id: str, **fields: Any) -> dict[str, Any]:
    return make_record(
        request_id,
        status="orphan",
        started_at=T0 + 1_234 + 600.0,
        llm_ttft_ms=900.0,
        event_count=1,
        late_events=1,
        amend=True,
        **fields,
    )


def _merge(stored: dict[str, Any], amendment: dict[str, Any]) -> dict[str, Any]:
    return merge_records(stored, amendment, W)


def test_amendment_merges_into_the_stored_record(ch_client: Client, ch_database: str) -> None:
    stored = full_record("r1", "acme")
    stored.update(llm_ttft_ms=None, other_ms=None, status="missing_stage", missing_stages=["llm_ttft"])
    stored["record_version"] = record_version(9, "missing_stage", 1)
    insert_requests(ch_client, ch_database, [stored])
    amendment = _late_llm_ttft("r1")
    written = apply_amendments(ch_client, ch_database, [amendment], _merge)
    expected = merge_records(stored, amendment, W)
    assert written == [expected]
    assert fetch_request(ch_client, ch_database, "r1") == expected
    assert expected["status"] == "complete" and expected["llm_ttft_ms"] == 900.0
    assert expected["event_count"] == 10
    # A replay of the writer's batch merges nothing twice (counters would otherwise grow).
    apply_amendments(ch_client, ch_database, [amendment], _merge)
    insert_requests(ch_client, ch_database, [stored])
    assert fetch_request(ch_client, ch_database, "r1") == expected
    assert count_requests(ch_client, ch_database) == 1


def test_amendments_of_one_request_fold_in_order(ch_client: Client, ch_database: str) -> None:
    stored = make_record("r2", status="missing_stage", missing_stages=["retrieval", "llm_ttft"], event_count=3)
    insert_requests(ch_client, ch_database, [stored])
    first = _late_llm_ttft("r2")
    second = make_record("r2", status="orphan", retrieval_ms=300.0, event_count=1, late_events=1, amend=True)
    apply_amendments(ch_client, ch_database, [first, second], _merge)
    expected = merge_records(merge_records(stored, first, W), second, W)
    assert fetch_request(ch_client, ch_database, "r2") == expected
    assert expected["missing_stages"] == []


def _joined(events: list[StageEvent], forgotten: bool = False) -> dict[str, Any]:
    """The record the join emits for ``events``; ``forgotten``: their amendment (the join's watermark
    passed them by more than ``forget_after_ms``)."""
    join = RequestJoin(JoinConfig(), W)
    if forgotten:
        join.add(StageEvent(request_id="clock", tenant_id="acme", stage="x", ts_ms=T0 + 10**7, duration_ms=0.0), 0, 0.0)
    out = [r for e in events for r in join.add(e, 0, 0.0) if isinstance(r, dict)]
    return out[0] if forgotten else join.advance(0, 10**15)[0]


def test_a_late_retry_is_summed_and_a_replay_is_not_through_the_store(ch_client: Client, ch_database: str) -> None:
    def ev(stage: str, ts: float, dur: float | None, eid: str) -> StageEvent:
        return StageEvent(request_id="r9", tenant_id="acme", stage=stage, ts_ms=T0 + ts, duration_ms=dur, event_id=eid)

    stored = _joined(
        [ev("request_start", 0, None, "root"), ev("retrieval", 1, 80.1, "first"), ev("first_token", 900, None, "ft")]
    )
    insert_requests(ch_client, ch_database, [stored])
    assert fetch_request(ch_client, ch_database, "r9") == store_form(stored)
    retry = _joined([ev("retrieval", 82, 500.0, "second")], forgotten=True)
    replay = _joined([ev("retrieval", 1, 80.1, "first")], forgotten=True)
    apply_amendments(ch_client, ch_database, [retry, replay], _merge)
    row = fetch_request(ch_client, ch_database, "r9")
    assert row is not None and row["retrieval_ms"] == 580.1 and row["stage_repeats"] == {"retrieval": 1}
    assert row["event_count"] == 4 and row["duplicate_events"] == 1
    assert sorted(row["event_keys"]) == sorted([*stored["event_keys"], *retry["event_keys"]])


def test_amendment_without_a_stored_record_is_kept_and_flagged(ch_client: Client, ch_database: str) -> None:
    amendment = _late_llm_ttft("never-stored")
    apply_amendments(ch_client, ch_database, [amendment], _merge)
    stored = fetch_request(ch_client, ch_database, "never-stored")
    assert stored == amendment
    assert stored is not None and stored["amend"] is True


def test_dead_letters_are_idempotent_on_topic_partition_offset(ch_client: Client, ch_database: str) -> None:
    raw = b"\xff\xfe{not json" + bytes(range(256))
    letters = [
        make_dead_letter(
            "invalid_json",
            "Expecting value: line 1 column 1 (char 0)",
            raw,
            topic="ttft.stage-events",
            partition=p,
            offset=o,
            kafka_timestamp_ms=RECENT_DAY_MS + 123 if p else None,
            max_original_bytes=64,
            received_at_ms=T0 + o,
            request_id="r'1" if o == 7 else None,
            tenant_id="租户" if o == 7 else None,
        )
        for p, o in [(0, 7), (1, 7), (0, 8)]
    ]
    insert_dead_letters(ch_client, ch_database, letters)
    insert_dead_letters(ch_client, ch_database, [letters[0].model_dump(mode="json")])  # replay, JSON shape
    insert_dead_letters(ch_client, ch_database, [letters[1].model_dump()])
    assert count_dead_letters(ch_client, ch_database) == 3
    rows = fetch_dead_letters(ch_client, ch_database)
    first = rows[0]
    coordinates = (first["source_topic"], first["source_partition"], first["source_offset"])
    assert coordinates == ("ttft.stage-events", 0, 7)
    assert first["original"] == raw[:64]
    assert first["original_length"] == len(raw)
    assert first["sha256"] == hashlib.sha256(raw).hexdigest()
    assert (first["request_id"], first["tenant_id"], first["kafka_timestamp"]) == ("r'1", "租户", None)
    assert [(r["source_partition"], r["source_offset"]) for r in rows] == [(0, 7), (0, 8), (1, 7)]
    assert rows[2]["kafka_timestamp"] == RECENT_DAY_MS + 123
    assert first["received_at"] == T0 + 7
    assert base64.b64encode(first["original"]).decode() == letters[0].model_dump(mode="json")["original"]


def test_pipeline_stats_are_written(ch_client: Client, ch_database: str) -> None:
    now_ms = time.time() * 1000  # wall clock: the table's TTL would drop old samples
    insert_stats(
        ch_client,
        ch_database,
        [
            stat_sample(now_ms, "w-1", "writer", "insert_latency_ms", 12.5),
            stat_sample(now_ms, "w-1", "join", "consumer_lag", 42, {"partition": "3"}),
        ],
    )
    rows = ch_client.query(
        f"SELECT metric, labels, value FROM {ch_database}.pipeline_stats ORDER BY metric"
    ).result_rows
    assert rows == [("consumer_lag", {"partition": "3"}, 42.0), ("insert_latency_ms", {}, 12.5)]


def test_one_chdb_directory_per_process(ch_client: Client, ch_database: str, ch_session_path: Path) -> None:
    settings = Settings(clickhouse_url=SecretStr(f"chdb://{ch_session_path}"))
    assert make_client(settings) is ch_client
    per_thread = make_client(settings, shared=False)
    assert per_thread is not ch_client
    insert_requests(ch_client, ch_database, [make_record("shared")])
    assert fetch_request(per_thread, ch_database, "shared") is not None
    other = Settings(clickhouse_url=SecretStr(f"chdb://{ch_session_path.parent / 'elsewhere'}"))
    with pytest.raises(StoreConfigError, match="one data directory per process"):
        make_client(other)


def test_stored_windows_name_the_windows_moved_requests_left(ch_client: Client, ch_database: str) -> None:
    from streams.store.requests_store import insert_requests, stored_windows, vacated_windows

    first = make_record("r-1", started_at=RECENT_DAY_MS + 61_000.0)
    stays = make_record("r-2", started_at=RECENT_DAY_MS + 61_000.0)
    insert_requests(ch_client, ch_database, [first, stays])
    before = stored_windows(ch_client, ch_database, [("acme", "r-1"), ("acme", "r-2"), ("acme", "r-none")])
    old_ws = int(first["window_start"])
    assert before == {("acme", "r-1"): old_ws, ("acme", "r-2"): old_ws}
    moved = make_record("r-1", started_at=RECENT_DAY_MS + 1_000.0, late_events=1, event_count=6)  # request_start late
    assert int(moved["window_start"]) != old_ws
    assert vacated_windows(before, [moved, stays]) == {old_ws}
