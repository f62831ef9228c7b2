"""merge_records: how the writer folds a late amendment of a forgotten request into the stored record."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events import StageEvent
from schemas.records import RequestRecord, record_version
from streams.core.join import RequestJoin, merge_records
from streams.settings import JoinConfig

T0 = 1_700_000_000_000.0
W = 60_000
CFG = JoinConfig()


def ev(stage: str, ts: float, dur: float | None = None, **kw: Any) -> StageEvent:
    kw.setdefault("tenant_id", "acme")
    return StageEvent(request_id="r1", stage=stage, ts_ms=T0 + ts, duration_ms=dur, **kw)


FULL = [
    ev("request_start", 0, version_id="v2", route="main", rollout="stable"),
    ev("retrieval", 10, 300.0),
    ev("vector_recall", 12, 100.0),
    ev("bm25_recall", 15, 120.0),
    ev("prompt_assemble", 320, 80.0, attrs={"prompt_tokens": 900}),
    ev("llm_ttft", 400, 900.0),
    ev("first_token", 1_350),
    ev("safety", 1_300, 3.0),
]


def joined(events: list[StageEvent]) -> dict[str, Any]:
    j = RequestJoin(CFG, W)
    for e in events:
        j.add(e, 0, 0.0)
    (record,) = j.advance(0, 10**9)
    return record


def amendment(event: StageEvent) -> dict[str, Any]:
    """The amend=True record the join emits for an event of a forgotten request."""
    j = RequestJoin(CFG, W)
    j.add(StageEvent(request_id="clock", tenant_id="acme", stage="x", ts_ms=T0 + 10**7, duration_ms=0.0), 0, 0.0)
    (record,) = j.add(event, 0, 0.0)
    assert isinstance(record, dict) and record["amend"] is True
    return record


@pytest.mark.parametrize("late", [e.stage for e in FULL])
def test_merging_the_late_event_gives_the_record_of_all_events(late: str) -> None:
    on_time = [e for e in FULL if e.stage != late]
    (late_event,) = [e for e in FULL if e.stage == late]
    merged = merge_records(joined(on_time), amendment(late_event), W)
    RequestRecord.model_validate(merged)
    expected = joined(FULL)
    if late in ("vector_recall", "bm25_recall"):
        assert merged["recall_mode"] is None  # the two recalls came apart: overlap unknown
        expected["recall_mode"] = None
    assert merged["late_events"] == 1 and merged["amend"] is False
    assert merged["record_version"] == record_version(8, merged["status"], 1)
    expected.update(late_events=1, record_version=merged["record_version"])
    assert merged == expected


def test_a_retry_that_comes_after_the_request_was_forgotten_is_summed() -> None:
    stored = joined(FULL)
    merged = merge_records(stored, amendment(ev("retrieval", 700, 50.0, event_id="attempt-2")), W)
    assert merged["retrieval_ms"] == stored["retrieval_ms"] + 50.0
    assert merged["stage_repeats"] == {"retrieval": 1}
    assert merged["other_ms"] == stored["other_ms"] - 50.0
    assert merged["event_count"] == stored["event_count"] + 1 == len(merged["event_keys"])
    RequestRecord.model_validate(merged)
    # The same attempt again (a replay) is counted once; a third attempt is summed too.
    again = merge_records(merged, amendment(ev("retrieval", 700, 50.0, event_id="attempt-2")), W)
    assert again == {**merged, "duplicate_events": merged["duplicate_events"] + 1}
    third = merge_records(merged, amendment(ev("retrieval", 800, 7.0)), W)
    assert third["retrieval_ms"] == merged["retrieval_ms"] + 7.0 and third["stage_repeats"] == {"retrieval": 2}


def test_a_late_event_counted_already_changes_no_value() -> None:
    stored = joined(FULL)
    for replayed in FULL:
        merged = merge_records(stored, amendment(replayed), W)
        assert merged == {**stored, "duplicate_events": stored["duplicate_events"] + 1}


def test_events_told_apart_by_id_else_by_time_and_per_stage() -> None:
    a = joined([ev("request_start", 0), ev("retrieval", 10, 5.0, event_id="x"), ev("rerank", 20, 5.0)])
    b = joined([ev("request_start", 0), ev("retrieval", 11, 6.0, event_id="x"), ev("rerank", 20, 5.0)])
    c = joined([ev("request_start", 0), ev("rerank", 10, 5.0, event_id="x"), ev("rerank", 20, 5.0)])
    assert a["event_keys"] == b["event_keys"]  # same stages, same event ids, same instants
    assert len(set(a["event_keys"]) & set(c["event_keys"])) == 2  # "x" is another event in another stage
    assert len(set(a["event_keys"])) == a["event_count"] == 3


def test_rows_without_event_keys_merge_as_before() -> None:
    stored = {**joined(FULL), "event_keys": []}  # a row written before the field
    merged = merge_records(stored, amendment(ev("retrieval", 700, 50.0, event_id="attempt-2")), W)
    assert merged["retrieval_ms"] == stored["retrieval_ms"] and merged["stage_repeats"] == {}
    assert merged["event_count"] == stored["event_count"] + 1 and merged["event_keys"] == []


def test_a_late_recall_attempt_leaves_the_recall_mode_unknown() -> None:
    stored = joined(FULL)
    assert stored["recall_mode"] == "parallel"
    merged = merge_records(stored, amendment(ev("vector_recall", 500, 20.0, event_id="again")), W)
    assert merged["vector_recall_ms"] == 120.0 and merged["recall_mode"] is None


def test_earliest_first_token_wins_in_a_merge() -> None:
    stored = joined(FULL)
    merged = merge_records(stored, amendment(ev("first_token", 1_000)), W)
    assert merged["first_token_at"] == T0 + 1_000 and merged["ttft_ms"] == 1_000.0
    assert merged["other_ms"] == 1_000.0 - (300.0 + 80.0 + 900.0)


def test_orphan_takes_identity_and_start_from_a_late_request_start() -> None:
    stored = joined([e for e in FULL if e.stage != "request_start"])
    assert stored["status"] == "orphan" and stored["version_id"] == "unknown"
    late_start = ev("request_start", -61_000, version_id="v9", route="fast", rollout="canary")
    merged = merge_records(stored, amendment(late_start), W)
    assert (merged["version_id"], merged["route"], merged["rollout"]) == ("v9", "fast", "canary")
    assert merged["started_at"] == T0 - 61_000
    assert merged["window_start"] == ((T0 - 61_000) // W) * W
    assert merged["ttft_ms"] == 1_350.0 + 61_000
    assert merged["status"] == "complete" and merged["missing_stages"] == []


def test_two_orphans_keep_the_earliest_events_identity() -> None:
    stored = joined([ev("retrieval", 10, 300.0, version_id="a")])
    merged = merge_records(stored, amendment(ev("rerank", 5, 3.0, version_id="b")), W)
    assert (merged["version_id"], merged["started_at"], merged["status"]) == ("b", T0 + 5, "orphan")
    merged = merge_records(stored, amendment(ev("rerank", 50, 3.0, version_id="b")), W)
    assert (merged["version_id"], merged["started_at"]) == ("a", T0 + 10)


def test_attrs_fill_only_gaps_and_fallback_is_the_maximum() -> None:
    stored = joined(FULL)
    late = ev("custom_late", 2, 1.0, attrs={"prompt_tokens": 5, "trace_id": "t1"}, fallback_level=3)
    merged = merge_records(stored, amendment(late), W)
    assert (merged["prompt_tokens"], merged["trace_id"], merged["fallback_level"]) == (900, "t1", 3)
    assert merged["custom_stages"] == {"custom_late": 1.0, "safety": 3.0}
