from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import orjson

from streams.app.alerting_hook import AlertingHook
from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.settings import Settings, WindowConfig
from streams.store.aggregates_store import dead_letter_counts, insert_rows, stored_window_series
from streams.store.requests_store import fetch_window_records
from tests.support.records import WINDOW_MS, make_record

NOW_S = 1_800_000_000.0
FIRST_WS = (NOW_S - 4 * 3_600) * 1000 // WINDOW_MS * WINDOW_MS  # four hours of history behind the clock
WINDOWS = 45
PER_WINDOW = 3


class FakeStore:
    """Records by window, and what the writer inserted by table."""

    def __init__(self) -> None:
        self.records: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if fn is fetch_window_records:
            return list(self.records[int(args[1])])
        if fn is dead_letter_counts:
            return {}
        if fn is stored_window_series:
            return []
        if fn is insert_rows:
            self.rows[args[1]] += list(args[2])
        return None


def history(store: FakeStore) -> list[dict[str, Any]]:
    out = []
    for w in range(WINDOWS):
        ws = FIRST_WS + w * WINDOW_MS
        for k in range(PER_WINDOW):
            rec = make_record(
                f"r-{w}-{k}",
                started_at=ws + 1_000.0 * (k + 1),
                first_token_at=ws + 1_000.0 * (k + 1) + 900.0,
                ttft_ms=900.0,
                retrieval_ms=200.0,
                prompt_assemble_ms=50.0,
                llm_ttft_ms=600.0,
            )
            store.records[int(ws)].append(rec)
            out.append(rec)
    return out


def test_many_windows_closing_at_once_are_each_evaluated_once_in_event_time_order() -> None:
    clock = [NOW_S]
    settings = Settings(windows=WindowConfig(idle_close_s=1.0), paging_muted=True, replay=True)
    metrics = WorkerMetrics("writer", "w-1")
    store = FakeStore()
    published: list[tuple[str, bytes, bytes]] = []

    async def publish(topic: str, key: bytes, value: bytes) -> None:
        published.append((topic, key, value))

    async def flush() -> None:
        return None

    async def scenario() -> AlertingHook:
        closer = WindowCloser(settings, metrics, store.call, publish, clock=lambda: clock[0])
        hook = AlertingHook(settings, metrics, store.call, publish, flush, muted=True)
        hook.attach(closer)
        records = history(store)
        # The whole backlog in two batches, then idle polls: every window closes in the same call.
        await closer.on_records(records[: len(records) // 2], polled_s=0.0)
        await closer.on_records(records[len(records) // 2 :], polled_s=0.0)
        assert not hook.evaluated  # historical: nothing closes until the polls go idle
        for _ in range(3):
            clock[0] += 1.0
            await closer.on_records([], polled_s=1.0)
        return hook

    hook = asyncio.run(scenario())
    expected = [int(FIRST_WS + w * WINDOW_MS) for w in range(WINDOWS)]
    evaluated = list(hook.evaluated)
    assert evaluated[:WINDOWS] == expected
    # Then the empty windows up to the idle watermark, one by one (silence is evaluated too).
    assert evaluated == [int(FIRST_WS + w * WINDOW_MS) for w in range(len(evaluated))]
    rows = store.rows["rule_evaluations"]
    with_samples = {
        int(r["window_start"].timestamp() * 1000)
        for r in rows
        if r["rule"] == "TTFTStageRegression" and r["samples"] > 0
    }
    assert with_samples == set(expected)
    regression = [r for r in rows if r["rule"] == "TTFTStageRegression" and r["stage"] == "retrieval"]
    assert len(regression) == WINDOWS  # once each
    statuses = [orjson.loads(v) for t, _, v in published if t == settings.topic("rule-evaluations")]
    assert len(statuses) == len(rows)
    assert not any(t == settings.topic("alerts") and b'"muted":false' in v for t, _, v in published)
    sample = metrics.render().decode()
    assert 'ttft_rule_evaluations_total{outcome="insufficient_history",rule="TTFTStageRegression"}' in sample


def test_a_replay_over_stored_windows_evaluates_each_of_them_once() -> None:
    from streams.app.writer_hooks import resume
    from streams.store.aggregates_store import (
        fetch_window_rows,
        request_window_fingerprints,
        stored_alert_keys,
        stored_window_fingerprints,
    )

    def run(replay: bool) -> list[int]:
        settings = Settings(windows=WindowConfig(idle_close_s=1.0), paging_muted=True, replay=replay)
        metrics = WorkerMetrics("writer", "w-1")
        store = FakeStore()
        records = history(store)
        stored = {int(ws): (PER_WINDOW, 1) for ws in store.records}  # every window already aggregated

        async def call(fn: Callable[..., Any], *args: Any) -> Any:
            if fn in (request_window_fingerprints, stored_window_fingerprints):
                return dict(stored)
            if fn is fetch_window_rows:
                return {}
            if fn is stored_alert_keys:
                return []
            return await store.call(fn, *args)

        async def publish(topic: str, key: bytes, value: bytes) -> None:
            return None

        async def flush() -> None:
            return None

        async def scenario() -> list[int]:
            clock = [NOW_S]
            closer = WindowCloser(settings, metrics, call, publish, clock=lambda: clock[0])
            hook = AlertingHook(settings, metrics, call, publish, flush, muted=True)
            await resume(settings, closer, hook)
            hook.attach(closer)
            await closer.on_records(records, polled_s=0.0)
            for _ in range(3):
                clock[0] += 1.0
                await closer.on_records([], polled_s=1.0)
            return [int(r["window_start"].timestamp() * 1000) for r in store.rows["rule_evaluations"] if r["samples"]]

        return asyncio.run(scenario())

    expected = [int(FIRST_WS + w * WINDOW_MS) for w in range(WINDOWS)]
    assert sorted(set(run(replay=True))) == expected
    # A live restart treats the re-delivered records as late amendments: stored, never judged again.
    assert run(replay=False) == []
