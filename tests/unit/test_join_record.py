"""Join semantics of one request record (docs/design.md, join semantics): status, stages, instants, attrs."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events import StageEvent
from schemas.records import RequestRecord, record_version
from streams.core.join import Refusal, RequestJoin
from streams.core.join_record import recall_mode, sorted_missing
from streams.settings import JoinConfig

T0 = 1_700_000_000_000.0
W = 60_000
CFG = JoinConfig()


def ev(stage: str, ts: float, dur: float | None = None, **kw: Any) -> StageEvent:
    kw.setdefault("request_id", "r1")
    kw.setdefault("tenant_id", "acme")
    return StageEvent(stage=stage, ts_ms=T0 + ts, duration_ms=dur, **kw)


def full(**start_kw: Any) -> list[StageEvent]:
    return [
        ev("request_start", 0, version_id="v7", rollout="canary", route="main", **start_kw),
        ev("retrieval", 10, 300.0),
        ev("prompt_assemble", 320, 80.0),
        ev("llm_ttft", 400, 900.0),
        ev("first_token", 1_350),
    ]


def join(events: list[StageEvent], config: JoinConfig = CFG) -> dict[str, Any]:
    """All events through a fresh join, then an idle tick long enough to emit everything."""
    j = RequestJoin(config, W)
    for e in events:
        # Refusals (a conflicting duplicate's losing copy) go to dead letters, never to records.
        assert [o for o in j.add(e, 0, 0.0) if not isinstance(o, Refusal)] == []
    records = j.advance(0, 10**9)
    assert len(records) == 1
    RequestRecord.model_validate(records[0])
    return records[0]


def without(events: list[StageEvent], *stages: str) -> list[StageEvent]:
    return [e for e in events if e.stage not in stages]


def test_complete_request_has_every_value() -> None:
    r = join(full())
    assert r["status"] == "complete"
    assert r["missing_stages"] == []
    assert (r["version_id"], r["rollout"], r["route"], r["tenant_id"]) == ("v7", "canary", "main", "acme")
    assert r["ttft_ms"] == 1_350.0
    assert (r["retrieval_ms"], r["prompt_assemble_ms"], r["llm_ttft_ms"]) == (300.0, 80.0, 900.0)
    assert r["other_ms"] == 70.0
    assert r["started_at"] == T0 and r["first_token_at"] == T0 + 1_350
    assert r["window_start"] == (T0 // W) * W
    assert r["event_count"] == 5
    assert r["record_version"] == record_version(5, "complete", 0)
    assert r["amend"] is False and r["late_events"] == 0 and r["duplicate_events"] == 0
    assert r["recall_mode"] == "none"
    assert r["vector_recall_ms"] is None and r["custom_stages"] == {} and r["stage_repeats"] == {}


@pytest.mark.parametrize(
    ("dropped", "status", "missing"),
    [
        ((), "complete", []),
        (("request_start",), "orphan", ["request_start"]),
        (("request_start", "first_token"), "orphan", ["request_start", "first_token"]),
        (("first_token",), "timed_out", ["first_token"]),
        (("first_token", "retrieval"), "timed_out", ["retrieval", "first_token"]),
        (("retrieval",), "missing_stage", ["retrieval"]),
        (("llm_ttft", "retrieval"), "missing_stage", ["retrieval", "llm_ttft"]),
        (
            ("prompt_assemble", "llm_ttft", "retrieval"),
            "missing_stage",
            ["retrieval", "prompt_assemble", "llm_ttft"],
        ),
        (("request_start", "retrieval"), "orphan", ["request_start", "retrieval"]),
    ],
)
def test_status_precedence_and_missing_stages(dropped: tuple[str, ...], status: str, missing: list[str]) -> None:
    events = without(full(), *dropped)
    r = join(list(reversed(events)))
    assert r["status"] == status
    assert r["missing_stages"] == missing


ROUTES = JoinConfig(
    route_required_stages={
        "fast": ("request_start", "prompt_assemble", "llm_ttft", "first_token"),
        "deep": (
            "request_start",
            "retrieval",
            "rerank",
            "safety_check",
            "prompt_assemble",
            "llm_ttft",
            "first_token",
        ),
    }
)


@pytest.mark.parametrize(
    ("route", "dropped", "status", "missing"),
    [
        ("fast", ("retrieval",), "complete", []),
        ("fast", ("llm_ttft",), "missing_stage", ["llm_ttft"]),
        ("main", ("retrieval",), "missing_stage", ["retrieval"]),
        ("deep", (), "missing_stage", ["rerank", "safety_check"]),
    ],
)
def test_required_stages_per_route(route: str, dropped: tuple[str, ...], status: str, missing: list[str]) -> None:
    events = [e.model_copy(update={"route": route}) for e in without(full(), *dropped)]
    r = join(events, ROUTES)
    assert (r["status"], r["missing_stages"]) == (status, missing)


def test_route_override_without_retrieval_keeps_null_not_zero() -> None:
    r = join([e.model_copy(update={"route": "fast"}) for e in without(full(), "retrieval")], ROUTES)
    assert r["status"] == "complete"
    assert r["retrieval_ms"] is None
    assert r["other_ms"] is None


def test_missing_stages_order_follows_required_then_known_then_name() -> None:
    assert sorted_missing(["zeta", "first_token", "rerank", "alpha", "request_start"]) == [
        "request_start",
        "first_token",
        "rerank",
        "alpha",
        "zeta",
    ]


@pytest.mark.parametrize("dropped", ["retrieval", "prompt_assemble", "llm_ttft"])
def test_absent_stage_is_null_and_other_is_null(dropped: str) -> None:
    r = join(without(full(), dropped))
    assert r[f"{dropped}_ms"] is None
    assert r["other_ms"] is None
    assert r["ttft_ms"] == 1_350.0


def test_other_ms_is_signed_when_stages_exceed_ttft() -> None:
    events = [*without(full(), "llm_ttft"), ev("llm_ttft", 400, 1_200.0)]
    r = join(events)
    assert r["other_ms"] == 1_350.0 - (300.0 + 80.0 + 1_200.0)
    assert r["other_ms"] < 0


def test_ttft_is_null_unless_both_instants() -> None:
    assert join(without(full(), "first_token"))["ttft_ms"] is None
    assert join(without(full(), "request_start"))["ttft_ms"] is None


@pytest.mark.parametrize(
    ("extra", "duplicates", "retrieval_ms", "repeats"),
    [
        ([ev("retrieval", 10, 300.0)], 1, 300.0, {}),  # same ts and duration, no event id
        ([ev("retrieval", 10, 300.0), ev("retrieval", 10, 300.0)], 2, 300.0, {}),
        ([ev("retrieval", 700, 50.0)], 0, 350.0, {"retrieval": 1}),  # a retry: summed
        ([ev("retrieval", 700, 50.0), ev("retrieval", 800, 25.0)], 0, 375.0, {"retrieval": 2}),
    ],
)
def test_duplicates_without_event_id_and_retries(
    extra: list[StageEvent], duplicates: int, retrieval_ms: float, repeats: dict[str, int]
) -> None:
    r = join(full() + extra)
    assert (r["duplicate_events"], r["retrieval_ms"], r["stage_repeats"]) == (
        duplicates,
        retrieval_ms,
        repeats,
    )
    assert r["event_count"] == 5 + len(extra) - duplicates


def test_duplicates_by_event_id_ignore_timing() -> None:
    base = [*without(full(), "retrieval"), ev("retrieval", 10, 300.0, event_id="e-1")]
    r = join([*base, ev("retrieval", 999, 1.0, event_id="e-1")])
    assert (r["duplicate_events"], r["retrieval_ms"], r["stage_repeats"]) == (1, 300.0, {})
    retried = join([*base, ev("retrieval", 10, 300.0, event_id="e-2")])
    assert (retried["duplicate_events"], retried["retrieval_ms"], retried["stage_repeats"]) == (
        0,
        600.0,
        {"retrieval": 1},
    )


def test_same_event_id_on_another_stage_is_not_a_duplicate() -> None:
    r = join([*full(), ev("rerank", 100, 20.0, event_id="x"), ev("bm25_recall", 20, 30.0, event_id="x")])
    assert r["duplicate_events"] == 0 and r["rerank_ms"] == 20.0 and r["bm25_recall_ms"] == 30.0


@pytest.mark.parametrize("stage", ["request_start", "first_token"])
def test_instants_earliest_wins_and_counts_a_repeat(stage: str) -> None:
    later = ev(stage, 1_400 if stage == "first_token" else 5)
    earlier = ev(stage, 1_300 if stage == "first_token" else -5)
    r = join([*full(), later, earlier])
    expected = {"first_token": (T0, T0 + 1_300), "request_start": (T0 - 5, T0 + 1_350)}[stage]
    assert (r["started_at"], r["first_token_at"]) == expected
    assert r["ttft_ms"] == expected[1] - expected[0]
    assert r["stage_repeats"] == {stage: 2}


@pytest.mark.parametrize(
    ("spans", "mode"),
    [
        ({"vector_recall": (10, 100.0), "bm25_recall": (20, 50.0)}, "parallel"),
        ({"vector_recall": (10, 100.0), "bm25_recall": (109, 50.0)}, "parallel"),
        ({"vector_recall": (10, 100.0), "bm25_recall": (110, 50.0)}, "serial"),  # touching is not overlap
        ({"vector_recall": (200, 30.0), "bm25_recall": (10, 100.0)}, "serial"),
        ({"vector_recall": (10, 100.0)}, "single"),
        ({"bm25_recall": (10, 100.0)}, "single"),
        ({}, "none"),
    ],
)
def test_recall_mode(spans: dict[str, tuple[float, float]], mode: str) -> None:
    r = join(full() + [ev(stage, ts, dur) for stage, (ts, dur) in spans.items()])
    assert r["recall_mode"] == mode
    for stage in ("vector_recall", "bm25_recall"):
        assert r[f"{stage}_ms"] == (spans[stage][1] if stage in spans else None)


def test_recall_mode_with_retried_recalls_looks_at_every_span() -> None:
    assert recall_mode([(0.0, 10.0), (50.0, 10.0)], [(55.0, 1.0)]) == "parallel"
    assert recall_mode([(0.0, 10.0), (50.0, 10.0)], [(20.0, 5.0)]) == "serial"
    assert recall_mode([(0.0, 0.0)], [(0.0, 0.0)]) == "serial"  # empty spans cannot overlap


def test_sub_stages_and_custom_stages() -> None:
    r = join(
        [
            *full(),
            ev("rerank", 250, 40.0),
            ev("safety_filter", 1_300, 12.5),
            ev("safety_filter", 1_320, 2.5),
            ev("query_rewrite", 1, 8.0),
        ]
    )
    assert r["rerank_ms"] == 40.0
    assert r["custom_stages"] == {"query_rewrite": 8.0, "safety_filter": 15.0}
    assert list(r["custom_stages"]) == ["query_rewrite", "safety_filter"]
    assert r["stage_repeats"] == {"safety_filter": 1}
    assert r["other_ms"] == 70.0  # sub-stages and custom stages are not part of other


def test_identity_from_request_start_even_when_it_is_not_first() -> None:
    events = full()
    events[1] = ev("retrieval", -50, 300.0, version_id="vX", route="fast", rollout="stable")
    r = join(list(reversed(events)))
    assert (r["version_id"], r["rollout"], r["route"]) == ("v7", "canary", "main")


def test_orphan_identity_and_started_at_from_earliest_event() -> None:
    events = [
        ev("llm_ttft", 400, 900.0, version_id="late"),
        ev("retrieval", 10, 300.0, version_id="early", route="fast"),
        ev("first_token", 1_350, version_id="latest"),
    ]
    r = join(events)
    assert r["status"] == "orphan"
    assert (r["version_id"], r["route"], r["started_at"]) == ("early", "fast", T0 + 10)
    assert r["window_start"] == ((T0 + 10) // W) * W
    assert r["ttft_ms"] is None


def test_fallback_level_is_the_maximum() -> None:
    events = full()
    events[2] = ev("prompt_assemble", 320, 80.0, fallback_level=2)
    events[3] = ev("llm_ttft", 400, 900.0, fallback_level=1)
    assert join(events)["fallback_level"] == 2


def test_well_known_attrs_prefer_the_owning_stage() -> None:
    events = [
        *full(),
        ev("retrieval_extra", 5, 1.0, attrs={"prompt_tokens": 1, "trace_id": "t-late", "rerank_top_k": 99}),
        ev("llm_ttft_b", 2, 1.0, attrs={"trace_id": "t-early", "draft_accept_rate": 0.1}),
    ]
    events[1] = ev("retrieval", 10, 300.0, attrs={"retrieval_cache_hit": False, "rerank_top_k": 20})
    events[2] = ev("prompt_assemble", 320, 80.0, attrs={"prompt_tokens": 1_500, "cached_tokens": 1_024})
    events[3] = ev(
        "llm_ttft",
        400,
        900.0,
        attrs={"prompt_tokens": 7, "prompt_cache_hit": True, "draft_accept_rate": 0.65},
    )
    events.append(ev("rerank", 250, 40.0, attrs={"rerank_top_k": 8}))
    r = join(events)
    assert r["prompt_tokens"] == 1_500
    assert r["cached_tokens"] == 1_024
    assert r["prompt_cache_hit"] is True
    assert r["draft_accept_rate"] == 0.65
    assert r["rerank_top_k"] == 8
    assert r["retrieval_cache_hit"] is False
    assert r["trace_id"] == "t-early"


def test_attrs_absent_are_null() -> None:
    r = join(full())
    for name in (
        "prompt_tokens",
        "cached_tokens",
        "prompt_cache_hit",
        "draft_accept_rate",
        "rerank_top_k",
        "retrieval_cache_hit",
        "trace_id",
    ):
        assert r[name] is None


def test_clock_skew_stage_ending_after_first_token_still_joins() -> None:
    # llm_ttft ends 400 ms after first_token (skewed clocks): it joins, and other_ms goes negative.
    j = RequestJoin(CFG, W)
    for e in [*without(full(), "llm_ttft"), ev("llm_ttft", 400, 1_350.0)]:
        j.add(e, 0, 0.0)
    j.add(ev("request_start", 1_350 + CFG.grace_ms, request_id="other"), 0, 0.0)
    assert j.advance(0, 0.0) == []  # due at llm_ttft's end (1750) + grace, not first_token + grace
    j.add(ev("request_start", 1_750 + CFG.grace_ms, request_id="other2"), 0, 0.0)
    (r,) = j.advance(0, 0.0)
    assert r["status"] == "complete" and r["llm_ttft_ms"] == 1_350.0
    assert r["other_ms"] == 1_350.0 - (300.0 + 80.0 + 1_350.0)
