"""Issue 3 acceptance through the real broker, `ttft worker` subprocesses and the chDB store.

Two module-scoped runs of the same seed-story traffic (historical, so windows close as soon as the stream is
idle) plus the same late request afterwards: a clean reference run, and a run whose writer is killed with
``kill -9`` while windows are open and closing. The crash test compares their ``stage_windows``; the late
test and the scenario test read the reference run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from streams.core.rollup import rollup_rows
from streams.settings import Settings
from streams.sim import SEED_STORY_TARGETS, phases
from tests.support.pipeline import produce_sync
from tests.support.scenarios import (
    MINUTE_MS,
    PipelinePair,
    breakdown_json,
    historical_start_ms,
    late_request_messages,
    numpy_window_check,
    read_topic,
    simulate,
)

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e]

#: Seed-story traffic: four 2-minute phases at 20 req/s over the four default tenants (~9,400 requests,
#: ~2,300 per phase, ~1,000 of them acme's): enough for phase P95s well within 10 % of the story's numbers.
STORY_RATE = 20.0
STORY_DURATION_S = 8 * 60
STORY_SEED = 1
STORY_TENANT = "acme"  # the largest default tenant (~43 % of the traffic)
LATE_REQUEST_ID = "late-amendment-1"
#: Historical traffic closes its last windows once the writer has seen no record for ``idle_close_s``
#: (default: join timeout + grace, 32 s); 10 s ends each run sooner.
STORY_ENV = {"TTFT_WINDOWS__IDLE_CLOSE_S": "10"}
WINDOW_COLUMNS = (
    "toUnixTimestamp64Milli(window_start) AS window_start, tenant_id, version_id, stage, count, p50, p95, "
    "p99, max, bins, zero_count, slo_bad_count, negative_count, relative_accuracy"
)

Key = tuple[int, str, str, str]


@dataclass
class StoryRun:
    """What one run of the story left behind (read after the writer exited)."""

    env: dict[str, str]
    start_ms: int
    late_window_ms: int
    seconds: float
    stage_windows: dict[Key, dict[str, Any]]
    late_window_requests: list[dict[str, Any]] = field(default_factory=list)
    late_window_health: list[dict[str, Any]] = field(default_factory=list)
    #: counts of the late request's (tenant, version, ttft, window) row, in publication order
    late_row_publications: list[int] = field(default_factory=list)
    amendments_metric: float = 0.0
    #: the writer's amendment counter just before the late request was produced
    amendments_before_late: float = 0.0
    #: writer metrics sampled at the kill (crash run only)
    kill_point: dict[str, float] = field(default_factory=dict)
    breakdowns: dict[str, dict[str, Any]] = field(default_factory=dict)


def _settings(kafka_broker: Any, home: Path) -> Settings:
    from streams.kafka.topics import ensure_topics

    prefix = f"i3{uuid.uuid4().hex[:8]}"
    settings = Settings(home=home, kafka_bootstrap=kafka_broker.bootstrap, topic_prefix=prefix, app_id=f"app-{prefix}")
    asyncio.run(ensure_topics(settings))
    return settings


def _late_window(start_ms: int) -> int:
    """A window in the middle of the second phase, so the before/after checks are untouched by it."""
    return start_ms + (STORY_DURATION_S * 1000 * 3 // 8) // MINUTE_MS * MINUTE_MS


def _kill_during_aggregation(pair: PipelinePair, expected_requests: int) -> dict[str, float]:
    """Wait for a point chosen by record count where windows are open and closing, then ``kill -9``."""
    seen: dict[str, float] = {"closed": 0.0}

    def due() -> bool:
        m = pair.writer.metrics()
        seen.update(
            closed_before=seen["closed"],
            closed=m.get("ttft_windows_closed_total", 0.0),
            written=m.get("ttft_records_written_total", 0.0),
            open_windows=m.get("ttft_open_windows", 0.0),
        )
        increasing = seen["closed"] > seen["closed_before"] >= 1
        return seen["written"] >= 0.4 * expected_requests and seen["open_windows"] > 0 and increasing

    pair.pipe.wait_for(due, 240, "a kill point: >= 40 % of records written, windows open and closing")
    pair.kill_writer()
    return seen


def _late_row_counts(settings: Settings, late_ws: int) -> list[int]:
    """Counts of the late request's (tenant, version, ttft, window) row on ``stage-windows``, in publication order."""
    key = f"{STORY_TENANT}|v12|ttft|{late_ws}".encode()
    return [
        int(json.loads(v)["count"])
        for k, v in read_topic(settings.kafka_bootstrap, settings.topic("stage-windows"))
        if k == key and v is not None
    ]


def _wait_for_amended_row(pair: PipelinePair, settings: Settings, late_ws: int, timeout_s: float = 90.0) -> None:
    """Wait until the writer published the late window's row again with one more request, before stopping it.

    The amendment counter grows when the recompute is queued, not when it lands (the closer runs it in the
    background). A run under load once read the store after the stop with the counter moved and the row not
    amended (CI, 2026-12-07); this waits for the row itself and, if it never comes, fails with the writer's
    closer metrics and log instead of a count that is one short."""
    deadline = time.monotonic() + timeout_s
    counts: list[int] = []
    while time.monotonic() < deadline:
        counts = _late_row_counts(settings, late_ws)
        if len(counts) >= 2 and counts[-1] - 1 in counts[:-1]:
            return
        time.sleep(2.0)
    m = pair.writer.metrics()
    closer = {k: v for k, v in m.items() if k.startswith(("ttft_window", "ttft_open_windows")) and "bucket" not in k}
    raise AssertionError(
        f"the late window's row was not republished within {timeout_s:.0f} s: publications {counts}; writer {closer}; "
        f"log: {pair.writer.log()[-3000:]}"
    )


def _run_story(settings: Settings, home: Path, start_ms: int, *, crash: bool) -> StoryRun:
    started = time.monotonic()
    late_ws = _late_window(start_ms)
    pair = PipelinePair.start(settings, home, **STORY_ENV)
    run = StoryRun(pair.env, start_ms, late_ws, 0.0, {})
    try:
        failures: list[BaseException] = []

        def produce() -> None:
            try:
                simulate(
                    pair.env,
                    "seed-story",
                    rate=STORY_RATE,
                    duration_s=STORY_DURATION_S,
                    seed=STORY_SEED,
                    start_ms=start_ms,
                )
            except BaseException as exc:  # re-raised in the test thread below
                failures.append(exc)

        if crash:  # the kill point needs windows that stay open until their records are in
            pair.check_event_time_before_traffic(start_ms)
        producing = threading.Thread(target=produce, daemon=True)
        producing.start()
        if crash:
            run.kill_point = _kill_during_aggregation(pair, int(STORY_RATE * STORY_DURATION_S))
            pair.start_writer()
        producing.join(600)
        if failures:
            raise failures[0]
        pair.wait_drained(600, "the story to be joined, stored and its windows closed")
        run.amendments_before_late = pair.writer.metric("ttft_window_amendments_total")
        # The late request: every stage inside an already closed window, produced now.
        late = late_request_messages(
            LATE_REQUEST_ID,
            STORY_TENANT,
            "v12",
            late_ws + 30_000,
            retrieval_ms=700.0,
            prompt_assemble_ms=300.0,
            llm_ttft_ms=1_500.0,
        )
        produce_sync(settings.kafka_bootstrap, settings.topic("stage-events"), late)
        pair.pipe.wait_for(
            lambda: pair.writer.metric("ttft_window_amendments_total") > run.amendments_before_late and pair.drained(),
            120,
            "the late request to amend its closed window",
        )
        run.amendments_metric = pair.writer.metric("ttft_window_amendments_total")
        _wait_for_amended_row(pair, settings, late_ws)
        pair.stop()
    finally:
        pair.pipe.stop_all()
    rows = pair.query(f"SELECT {WINDOW_COLUMNS} FROM {{db}}.stage_windows FINAL")
    run.stage_windows = {(int(r["window_start"]), r["tenant_id"], r["version_id"], r["stage"]): r for r in rows}
    window = f"window_start = fromUnixTimestamp64Milli({late_ws}, 'UTC')"
    # Not aliased as window_start: a ClickHouse alias would shadow the column in the WHERE clause.
    late_rows = pair.query(
        "SELECT toUnixTimestamp64Milli(window_start) AS window_ms, request_id, tenant_id, version_id, status, amend, "
        "retrieval_ms, vector_recall_ms, bm25_recall_ms, rerank_ms, prompt_assemble_ms, llm_ttft_ms, other_ms, "
        f"ttft_ms FROM {{db}}.requests FINAL WHERE {window}"
    )
    run.late_window_requests = [{**r, "window_start": r.pop("window_ms")} for r in late_rows]
    run.late_window_health = pair.query(f"SELECT * FROM {{db}}.window_health FINAL WHERE {window}")
    run.late_row_publications = _late_row_counts(settings, late_ws)
    if not crash:
        for name, p_start, p_end in phases("seed-story", start_ms, STORY_DURATION_S):
            run.breakdowns[name] = breakdown_json(pair.env, STORY_TENANT, p_start, p_end)
    run.seconds = time.monotonic() - started
    return run


@pytest.fixture(scope="module")
def story_start_ms() -> int:
    """One event-time start for both runs, so their windows and request ids are the same."""
    return historical_start_ms(hours_ago=4)


@pytest.fixture(scope="module")
def story_reference(
    kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory, story_start_ms: int
) -> Iterator[StoryRun]:
    home = tmp_path_factory.mktemp("story-reference")
    yield _run_story(_settings(kafka_broker, home), home, story_start_ms, crash=False)


@pytest.fixture(scope="module")
def story_crashed(
    kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory, story_start_ms: int
) -> Iterator[StoryRun]:
    home = tmp_path_factory.mktemp("story-crashed")
    yield _run_story(_settings(kafka_broker, home), home, story_start_ms, crash=True)


def _window_state(row: dict[str, Any]) -> tuple[Any, ...]:
    bins = {int(k): int(v) for k, v in row["bins"].items()}
    return (row["count"], bins, row["zero_count"], row["slo_bad_count"], row["negative_count"])


def _counts(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["count"], row["zero_count"], row["slo_bad_count"], row["negative_count"]


def test_kill_9_during_aggregation_gives_the_clean_runs_windows(
    story_reference: StoryRun, story_crashed: StoryRun
) -> None:
    kill = story_crashed.kill_point
    print(
        f"kill point: {kill}; reference run {story_reference.seconds:.0f} s, crashed run {story_crashed.seconds:.0f} s"
    )
    assert kill["open_windows"] > 0 and kill["closed"] > kill["closed_before"] >= 1
    ref, got = story_reference.stage_windows, story_crashed.stage_windows
    # 8 one-minute windows x 3 tenants x the story's versions x ~9 stages: about 250 keys; guard against a vacuous
    # comparison, not a size target.
    assert len(ref) > 200
    assert set(got) == set(ref), f"missing {sorted(set(ref) - set(got))[:5]}, extra {sorted(set(got) - set(ref))[:5]}"
    differ = [k for k in ref if _window_state(ref[k]) != _window_state(got[k])]
    # Each differing key with its (count, zero, SLO-bad, negative) in the reference and in the crashed run, and the
    # late request's window: a diagnosis without a rerun.
    detail = [(k, _counts(ref[k]), _counts(got[k])) for k in differ[:5]]
    late = story_crashed.late_window_ms
    assert not differ, f"{len(differ)} of {len(ref)} windows differ (late window {late}), e.g. {detail}"
    print(f"{len(ref)} stage-window rows equal; {sum(r['count'] for r in ref.values())} samples")


def test_late_record_amends_its_closed_window_and_matches_numpy(story_reference: StoryRun) -> None:
    run = story_reference
    late = [r for r in run.late_window_requests if r["request_id"] == LATE_REQUEST_ID]
    assert len(late) == 1 and late[0]["status"] == "complete", late
    assert run.amendments_metric > run.amendments_before_late
    health = [h for h in run.late_window_health if (h["tenant_id"], h["version_id"]) == (STORY_TENANT, "v12")]
    assert len(health) == 1 and health[0]["amendments"] >= 1, health
    pubs = run.late_row_publications
    # Published once without the late request, then amended to include it.
    assert len(pubs) >= 2 and pubs[-1] - 1 in pubs[:-1], f"ttft row counts as published: {pubs}"
    rows = [r for k, r in run.stage_windows.items() if k[0] == run.late_window_ms]
    checked, problems = numpy_window_check(run.late_window_requests, rows)
    print(
        f"late window {run.late_window_ms}: {len(run.late_window_requests)} requests, {len(rows)} rows, "
        f"{checked} quantiles checked, publications {pubs}, amendments {run.amendments_before_late:.0f} -> "
        f"{run.amendments_metric:.0f}"
    )
    assert not problems, problems[:10]
    assert checked >= 30


def _phase_p95(run: StoryRun, start_ms: float, end_ms: float) -> dict[str, float | None]:
    """All tenants' stage P95s over a phase, rolled up from the stored bins (the project's one rollup)."""
    rows = [r for k, r in run.stage_windows.items() if start_ms <= k[0] < end_ms]
    merged = rollup_rows(rows, group_by=("stage",))
    return {k[0]: r.quantile(0.95) for k, r in merged.items()}


def test_seed_story_before_and_after_stage_p95s(story_reference: StoryRun) -> None:
    bounds = {name: (s, e) for name, s, e in phases("seed-story", story_reference.start_ms, STORY_DURATION_S)}
    targets = {
        "before": SEED_STORY_TARGETS["before"],
        "routing-speculative": {"llm_ttft": 1000.0, "retrieval": 480.0, "prompt_assemble": 280.0},
    }
    report: dict[str, Any] = {}
    bad: list[str] = []
    for phase, want in targets.items():
        everyone = _phase_p95(story_reference, *bounds[phase])
        tenant = story_reference.breakdowns[phase]
        tenant_p95 = {**{s["stage"]: s["p95"] for s in tenant["stages"]}, "ttft": tenant["ttft_p95"]}
        report[phase] = {"all": everyone, STORY_TENANT: tenant_p95}
        for stage, target in want.items():
            for who, got in (("all", everyone.get(stage)), (STORY_TENANT, tenant_p95.get(stage))):
                if got is None or abs(got - target) > 0.10 * target:
                    bad.append(f"{phase}/{who}/{stage}: {got} vs {target}")
    print(json.dumps(report, indent=1, default=str))
    assert not bad, bad


def test_breakdown_names_llm_first_and_ttft_p95_is_not_the_sum(story_reference: StoryRun) -> None:
    before = story_reference.breakdowns["before"]
    after = story_reference.breakdowns["routing-speculative"]
    parents = [s["stage"] for s in before["stages"] if s["kind"] == "parent"]
    print(
        f"before: order {parents}, cut_first {before['cut_first']} ({before['reason']}); after: sum of stage "
        f"P95s {after['parent_p95_sum']:.0f} ms vs TTFT P95 {after['ttft_p95']:.0f} ms"
    )
    assert parents[0] == "llm_ttft"
    assert before["cut_first"] == "llm_ttft", before["reason"]
    assert before["windows"] == STORY_DURATION_S // 4 // 60  # every window of the phase attributed
    total, true = after["parent_p95_sum"], after["ttft_p95"]
    assert total is not None and true is not None
    # Each stored P95 is within 1 % (the sketch accuracy), so equal true values could differ by ~2 % at most.
    assert total - true > 0.02 * true, (total, true)


def test_historical_traffic_closes_each_window_once_despite_a_join_stall(kafka_settings: Any, tmp_path: Path) -> None:
    """The minimal reproduction: ~3,000 requests, no late event, so no window may ever be amended."""
    from streams.sim import generate

    start_ms = historical_start_ms(hours_ago=2)
    messages = generate("steady", rate_rps=5, duration_s=600, tenants=["acme"], seed=3, start_ms=start_ms)
    traffic = [(k, v) for k, v, _ in messages]
    end_ms = start_ms + 600_000
    pair = PipelinePair.start(kafka_settings, tmp_path, TTFT_WINDOWS__IDLE_CLOSE_S="10")
    try:
        pair.check_event_time_before_traffic(start_ms)
        produce_sync(kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events"), traffic)
        pair.pipe.wait_for(lambda: pair.writer.metric("ttft_records_written_total") >= 300, 120, "the first records")
        # A 3 s stall of the join (GC, rebalance, a busy host), shorter than idle_close_s: event time must not
        # move to the wall clock, which would close every window of the backlog before its records are in.
        pair.join.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3.0)
            watermark = pair.writer.metric("ttft_writer_watermark_ms")
            written = pair.writer.metric("ttft_records_written_total")
        finally:
            pair.join.proc.send_signal(signal.SIGCONT)
        if written >= 0.9 * len(traffic) / 7:  # ~7 events per request
            raise RuntimeError(f"the join was not behind at the stall ({written:.0f} records written)")
        pair.wait_drained(180)
        amendments = pair.writer.metric("ttft_window_amendments_total")
        pair.stop()
    finally:
        pair.pipe.stop_all()
    print(
        f"writer event time during the stall: {(watermark - end_ms) / 1000:+.0f} s from the traffic's end; "
        f"{amendments:.0f} window amendments without any late event"
    )
    assert watermark <= end_ms + 60_000
    assert amendments == 0
