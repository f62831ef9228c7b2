"""The ``no_first_chunk`` status: a request whose LLM call was answered but whose telemetry tells no first chunk
(the reserved stage ``llm_unmeasured``). Its status, when the join emits it, how amendments merge it, what it
feeds in a window (sketches of its present stages, completeness, never the SLO) and what the rules say."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from schemas.events import StageEvent
from schemas.records import STATUS_ORDER, STATUS_RANK, RequestRecord, record_version
from streams.cli.request_cmd import show_record
from streams.core import native
from streams.core.health import window_health_row
from streams.core.join import RequestJoin, merge_records
from streams.core.join_record import status_of, window_start
from streams.core.stages import is_sketched, is_slo_bad, stage_samples
from streams.core.windows import aggregate_window
from streams.emit import event_json
from streams.rules import RuleEngine, RulesConfig
from streams.rules.model import WindowSnapshot
from streams.rules.snapshot import TenantWindow, window_facts
from streams.settings import JoinConfig, Settings
from tests.unit.test_native_core import _fold

T0 = 1_700_000_000_000.0
W = 60_000
CFG = JoinConfig()


def ev(stage: str, ts: float, dur: float | None = None, rid: str = "r1", **kw: Any) -> StageEvent:
    kw.setdefault("tenant_id", "acme")
    return StageEvent(request_id=rid, stage=stage, ts_ms=T0 + ts, duration_ms=dur, **kw)


UNMEASURED = [
    ev("request_start", 0, route="gpt-4o-mini"),
    ev("retrieval", 10, 300.0, event_id="ret"),
    ev("prompt_assemble", 310, 40.0, attrs={"derived": True}),
    ev("llm_unmeasured", 350, 1_200.0, event_id="llm", attrs={"prompt_tokens": 812, "scope_name": "x"}),
]


def joined(events: list[StageEvent], config: JoinConfig = CFG) -> tuple[RequestJoin, list[dict[str, Any]]]:
    j = RequestJoin(config, W)
    out: list[Any] = []
    for e in events:
        out += j.add(e, 0, 0.0)
    return j, out


def test_status_precedence_puts_no_first_chunk_after_orphan_and_before_timed_out() -> None:
    assert STATUS_ORDER == ("orphan", "no_first_chunk", "timed_out", "missing_stage", "complete")
    assert status_of(False, False, ["request_start"], unmeasured=True) == "orphan"
    assert status_of(True, False, ["llm_ttft", "first_token"], unmeasured=True) == "no_first_chunk"
    assert status_of(True, False, ["llm_ttft", "first_token"]) == "timed_out"
    assert status_of(True, True, ["llm_ttft"], unmeasured=True) == "missing_stage"  # a first token came anyway
    assert status_of(True, True, [], unmeasured=True) == "complete"


def test_record_version_ranks_it_between_timed_out_and_missing_stage() -> None:
    ranks = [STATUS_RANK[s] for s in ("orphan", "timed_out", "no_first_chunk", "missing_stage", "complete")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 5 and max(ranks) < 16  # four bits of the version
    assert record_version(4, "timed_out") < record_version(4, "no_first_chunk") < record_version(4, "missing_stage")
    assert record_version(5, "timed_out") > record_version(4, "complete")  # more events win first


def test_an_unmeasured_call_makes_the_request_no_first_chunk_with_its_other_stages() -> None:
    j, out = joined(UNMEASURED)
    assert out == []
    # Idle ticks move the watermark on from the call's end (the latest event end) by the wall time since the
    # last event: it is due like a first token, at the call's end plus the grace, not at the request timeout.
    assert j.advance(0, CFG.grace_ms - 1.0) == []
    (record,) = j.advance(0, float(CFG.grace_ms))
    RequestRecord.model_validate(record)
    assert record["status"] == "no_first_chunk"
    assert record["missing_stages"] == ["llm_ttft", "first_token"]
    assert (record["retrieval_ms"], record["prompt_assemble_ms"], record["llm_unmeasured_ms"]) == (300.0, 40.0, 1_200.0)
    assert record["llm_ttft_ms"] is None and record["ttft_ms"] is None and record["first_token_at"] is None
    assert record["custom_stages"] == {} and record["prompt_tokens"] == 812
    assert record["record_version"] == record_version(4, "no_first_chunk")
    assert j.counters.emitted["no_first_chunk"] == 1


def test_without_the_unmeasured_call_the_request_waits_for_the_timeout() -> None:
    j, _ = joined(UNMEASURED[:3])
    last_end = 350.0  # prompt_assemble's end: idle ticks move the watermark on from there
    assert j.advance(0, CFG.grace_ms + 1_200.0) == []
    assert j.advance(0, CFG.request_timeout_ms - last_end - 1.0) == []
    (record,) = j.advance(0, CFG.request_timeout_ms - last_end)
    assert record["status"] == "timed_out" and record["llm_unmeasured_ms"] is None


def test_retried_unmeasured_calls_sum_and_count_a_repeat() -> None:
    again = ev("llm_unmeasured", 1_600, 900.0, event_id="llm2")
    j, _ = joined([*UNMEASURED, again])
    (record,) = j.advance(0, 10**9)
    assert record["llm_unmeasured_ms"] == 2_100.0 and record["stage_repeats"] == {"llm_unmeasured": 1}


def test_an_unmeasured_call_beside_a_first_token_is_no_status_of_its_own() -> None:
    j, _ = joined([*UNMEASURED, ev("first_token", 900)])
    (record,) = j.advance(0, 10**9)
    assert record["status"] == "missing_stage" and record["missing_stages"] == ["llm_ttft"]
    assert record["ttft_ms"] == 900.0 and record["llm_unmeasured_ms"] == 1_200.0


def test_without_request_start_it_is_an_orphan() -> None:
    j, _ = joined(UNMEASURED[1:])
    (record,) = j.advance(0, 10**9)
    assert record["status"] == "orphan" and record["llm_unmeasured_ms"] == 1_200.0


def _record(events: list[StageEvent]) -> dict[str, Any]:
    j, _ = joined(events)
    (record,) = j.advance(0, 10**9)
    return record


@pytest.mark.parametrize(
    ("stored", "late", "status"),
    [
        (UNMEASURED[:3], UNMEASURED[3:], "no_first_chunk"),  # the call came after the request was stored
        (UNMEASURED[1:], UNMEASURED[:1], "no_first_chunk"),  # request_start came late to a stored orphan
        (UNMEASURED, [ev("first_token", 900)], "missing_stage"),  # a late first token wins
        (UNMEASURED[:2] + UNMEASURED[3:], UNMEASURED[2:3], "no_first_chunk"),  # a late stage keeps it
    ],
)
def test_amendments_merge_into_a_stored_no_first_chunk(
    stored: list[StageEvent], late: list[StageEvent], status: str
) -> None:
    base = _record(stored)
    amendment = {**_record(late), "amend": True, "late_events": 1}
    merged = merge_records(base, amendment, W)
    RequestRecord.model_validate(merged)
    assert merged["status"] == status
    assert merged["llm_unmeasured_ms"] == 1_200.0
    whole = _record(stored + late)
    assert merged == {**whole, "late_events": 1, "record_version": record_version(whole["event_count"], status, 1)}


def test_a_stored_record_without_the_field_merges_as_none() -> None:
    base = _record(UNMEASURED[:3])
    del base["llm_unmeasured_ms"]  # a row read before the column existed
    merged = merge_records(base, {**_record([ev("retrieval", 900, 5.0, event_id="r2")]), "amend": True}, W)
    assert merged["status"] == "timed_out" and merged["llm_unmeasured_ms"] is None


def test_an_unmeasured_record_feeds_its_present_stages_and_is_never_slo_bad() -> None:
    record = _record(UNMEASURED)
    assert is_sketched(record)
    assert not is_slo_bad(record, slo_ms=1.0)
    samples = stage_samples([record])
    assert set(samples) == {"retrieval", "prompt_assemble"}  # no llm_ttft, other, ttft, nor a custom stage


def test_window_health_counts_it_as_a_status_of_its_own() -> None:
    records = [_record(UNMEASURED), _record(UNMEASURED[:3]), _record([*UNMEASURED[:3], ev("first_token", 900)])]
    row = window_health_row(0, ("acme", "unknown"), records)
    assert (row["total"], row["no_first_chunk"], row["timed_out"], row["missing_stage"]) == (3, 1, 1, 1)
    assert row["no_first_chunk_share"] == pytest.approx(1 / 3)
    columns = list(row)
    assert columns.index("timed_out") < columns.index("no_first_chunk") < columns.index("orphan")


def test_the_rules_see_it_and_name_it_with_its_fix() -> None:
    health = {"tenant_id": "acme", "version_id": "unknown", "total": 10, "complete": 2, "no_first_chunk": 8}
    ttft = {"tenant_id": "acme", "version_id": "unknown", "stage": "ttft", "count": 2, "slo_bad_count": 1}
    facts = window_facts(WindowSnapshot(window_health=[health], stage_windows=[ttft]))
    t = facts.tenants["acme"]
    assert (t.requests, t.slo_requests, t.no_first_chunk) == (10, 2, 8)
    text = t.describe("acme", 0.9)
    assert "no_first_chunk 8" in text and "gen_ai.response.time_to_first_chunk" in text
    assert t.numbers()["no_first_chunk"] == 8.0
    assert "time_to_first_chunk" not in TenantWindow(total=10, complete=10, has_health=True).describe("a", 0.9)


def _messages(n: int, seed: int) -> list[tuple[str, str]]:
    """Requests with and without their unmeasured LLM call, some without request_start, some late."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for i in range(n):
        rid, start = f"u{i}", T0 - 3_600_000 + i * 40.0
        stages: list[tuple[str, float, float | None]] = [("request_start", start, None)]
        stages.append(("retrieval", start + 5, rng.uniform(50, 400)))
        if rng.random() < 0.8:
            stages.append(("llm_unmeasured", start + 500, rng.uniform(300, 3_000)))
        if rng.random() < 0.2:
            stages.append(("first_token", start + 900, None))
        if rng.random() < 0.1:
            stages = stages[1:]
        rng.shuffle(stages)
        for j, (stage, ts, dur) in enumerate(stages):
            value = event_json(rid, ("acme", "globex")[i % 2], stage, ts, dur, event_id=f"{rid}-{j}")
            out.append((rid, value.decode()))
    return out


@pytest.mark.parametrize("caps", [{}, {"max_open_requests": 40, "max_open_requests_per_tenant": 15}])
def test_compiled_and_source_fold_unmeasured_calls_alike(tmp_path: Path, caps: dict[str, int]) -> None:
    messages_file = tmp_path / "messages.json"
    messages_file.write_bytes(orjson.dumps(_messages(1_500, seed=25)))
    source = _fold(tmp_path, messages_file, caps, native_on=False)
    compiled = _fold(tmp_path, messages_file, caps, native_on=True)
    assert source["status"] == "python (TTFT_NATIVE=0)"
    assert compiled["status"] == "native", native.check_manifest()
    assert source["digest"] == compiled["digest"]


def _window_of(records: list[dict[str, Any]]) -> WindowSnapshot:
    agg = aggregate_window(records, window_start(T0, W), Settings())
    return WindowSnapshot(stage_windows=agg.stage_windows, window_health=agg.window_health)


def _requests(n: int, tenant: str, unmeasured: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        events = UNMEASURED if unmeasured else [*UNMEASURED[:3], ev("llm_ttft", 350, 400.0), ev("first_token", 750)]
        out.append(_record([e.model_copy(update={"request_id": f"{tenant}-{i}", "tenant_id": tenant}) for e in events]))
    return out


def test_a_tenant_whose_llm_spans_tell_no_first_chunk_is_told_so_by_telemetry_degraded() -> None:
    records = _requests(60, "blind", unmeasured=True) + _requests(60, "seen", unmeasured=False)
    snap = _window_of(records)
    by_stage = {(r["tenant_id"], r["stage"]): r for r in snap.stage_windows}
    assert by_stage[("blind", "retrieval")]["count"] == 60  # its real measurements are kept
    assert ("blind", "llm_ttft") not in by_stage  # its ttft row holds no sample and no SLO-bad one
    assert (by_stage[("blind", "ttft")]["count"], by_stage[("blind", "ttft")]["slo_bad_count"]) == (0, 0)
    engine = RuleEngine(RulesConfig(), Settings())
    evaluation = engine.evaluate_window(window_start(T0, W), snap)
    (fired,) = [t for t in evaluation.transitions if t.alertname == "TTFTTelemetryDegraded"]
    assert fired.labels["tenant"] == "blind"
    assert "60 LLM calls without a first chunk" in fired.annotations["summary"]
    assert "no_first_chunk 60" in fired.annotations["description"]
    assert "gen_ai.response.time_to_first_chunk" in fired.annotations["description"]


def test_no_first_chunk_requests_count_in_no_slo_total() -> None:
    settings = Settings()
    slow = [{**r, "ttft_ms": 10_000.0} for r in _requests(10, "t", unmeasured=False)]  # all SLO-bad
    snap = _window_of([*slow, *_requests(90, "t", unmeasured=True)])
    facts = window_facts(snap)
    assert (facts.tenants["t"].slo_bad, facts.tenants["t"].slo_requests) == (10, 10)  # 100 %, not 10 %
    assert settings.slo_ms("t") < 10_000.0


def test_ttft_request_shows_the_unmeasured_call() -> None:
    console = Console(width=120, record=True)
    show_record(console, _record(UNMEASURED))
    text = console.export_text()
    assert "status no_first_chunk" in text and "no first chunk in its telemetry: 1,200.0 ms" in text
