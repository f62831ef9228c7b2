"""Issue 27 item 3 with the default settings, in the writer over the real (embedded) store: a tenant promoted
by steady_windows keeps its series slots against 20,000 sprayed one-request tenant ids, and a writer restart
keeps its promotion, its series and its silence watch (the promotion is derived from the stored windows)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from clickhouse_connect.driver.client import Client

from streams.app.alerting_hook import AlertingHook
from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.app.writer_hooks import resume
from streams.core.tenancy import SteadyLedger
from streams.settings import Settings, WindowConfig
from streams.store.aggregates_store import stored_window_series
from streams.store.requests_store import insert_requests, steady_history
from tests.support.records import WINDOW_MS, make_record

pytestmark = [pytest.mark.clickhouse, pytest.mark.timeout(300)]

NOW_S = 1_800_000_000.0
FIRST_WS = int((NOW_S - 20 * 60) * 1000 // WINDOW_MS * WINDOW_MS)  # 20 windows behind the clock
VERSIONS = ("v1", "v2", "v3")
SPRAY = 20_000


def _window(w: int, *, steady: bool = True, spray: int = 0) -> list[dict[str, Any]]:
    ws = FIRST_WS + w * WINDOW_MS
    out = []
    if steady:
        for k in range(30):
            out.append(
                make_record(
                    f"s-{w}-{k}",
                    tenant_id="steady",
                    version_id=VERSIONS[k % 3],
                    started_at=ws + 1_000.0 + k,
                    first_token_at=ws + 1_900.0 + k,
                    ttft_ms=900.0,
                )
            )
    for k in range(spray):
        out.append(make_record(f"f-{w}-{k}", tenant_id=f"fake-{w}-{k}", started_at=ws + 2_000.0 + k * 0.001))
    return out


def _silent_alerts(published: list[tuple[str, bytes, bytes]], settings: Settings) -> list[tuple[str, str]]:
    out = []
    for topic, _, value in published:
        if topic == settings.topic("alerts"):
            message = orjson.loads(value)
            if message["alertname"] == "TTFTTenantSilent":
                out.append((message["labels"].get("tenant", ""), message["state"]))
    return out


def test_a_promoted_tenant_keeps_its_series_and_silence_watch_across_a_writer_restart(
    ch_client: Client, ch_database: str
) -> None:
    settings = Settings(
        clickhouse_database=ch_database, windows=WindowConfig(idle_close_s=1.0), paging_muted=True, replay=False
    )
    assert settings.tenancy.steady_windows == 3 and not settings.tenants  # the defaults: nothing configured
    published: list[tuple[str, bytes, bytes]] = []
    recovered: list[frozenset[str]] = []

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        return fn(ch_client, *args)

    async def publish(topic: str, key: bytes, value: bytes) -> None:
        published.append((topic, key, value))

    async def flush() -> None:
        return None

    def series(w: int) -> set[tuple[str, str]]:
        return set(stored_window_series(ch_client, ch_database, FIRST_WS + w * WINDOW_MS))

    async def writer(clock: list[float], batches: list[list[dict[str, Any]]]) -> tuple[WindowCloser, AlertingHook]:
        metrics = WorkerMetrics("writer", "w-1")
        closer = WindowCloser(settings, metrics, call, publish, clock=lambda: clock[0])
        hook = AlertingHook(settings, metrics, call, publish, flush, muted=True)
        await closer.recover()  # what resume() does first: the promotions come from the stored windows
        recovered.append(closer.tenants.registered)
        await resume(settings, closer, hook)
        hook.attach(closer)
        for records in batches:
            insert_requests(ch_client, ch_database, records)
            await closer.on_records(records, polled_s=0.0)
        for _ in range(3):
            clock[0] += 1.0
            await closer.on_records([], polled_s=1.0)
        await closer.drain()
        return closer, hook

    async def scenario() -> None:
        clock = [NOW_S]
        # "steady" sends in windows 0-3 (promoted by its third window in a row); 20,000 made-up ids in window 3,
        # 2,000 in windows 0 and 1, where "steady" still shares the pool's series slots with them.
        windows = [_window(0, spray=2_000), _window(1, spray=2_000), _window(2), _window(3, spray=SPRAY)]
        closer, _ = await writer(clock, windows)
        assert not {("steady", v) for v in VERSIONS} <= series(0)
        assert "steady" in closer.tenants.registered and len(closer.tenants.registered) == 1
        assert {("steady", v) for v in VERSIONS} <= series(3)  # none of its slots went to the spray
        assert len([s for s in series(3) if s[0].startswith("fake-")]) == settings.tenancy.max_series_pool

        # A restart: the promotion comes back from the stored windows, and with it the series and the watch.
        published.clear()
        closer, hook = await writer(clock, [_window(4, spray=SPRAY)])
        assert recovered == [frozenset(), {"steady"}]
        assert closer.tenants.registered == {"steady"}
        assert {("steady", v) for v in VERSIONS} <= series(4)
        assert "steady" in hook.engine._tenant_seen
        # "steady" sent nothing after window 4: its silence is watched (a ticket), the spray's is not.
        assert ("steady", "firing") in _silent_alerts(published, settings)
        assert {tenant for tenant, _ in _silent_alerts(published, settings)} == {"steady"}

    asyncio.run(scenario())


def test_the_stored_windows_give_the_same_promotions_as_booking_them_one_by_one(
    ch_client: Client, ch_database: str
) -> None:
    # Tenants with runs of different lengths and gaps, over 12 windows; keep = 4 windows.
    presence = {
        "a": {0, 1, 2, 3},  # promoted at 2, last run ends at 3: kept until 7
        "b": {0, 1, 3, 4, 5, 9, 10, 11},  # promoted at 5, then again at 11
        "c": {8, 9},  # a run of 2: not yet
        "d": {10, 11},  # a run of 2 reaching the newest window: continues live
    }
    presence |= {f"once-{k}": {k % 12} for k in range(300)}
    records = [
        make_record(f"{t}-{w}", tenant_id=t, started_at=FIRST_WS + w * WINDOW_MS + 1_000.0)
        for t, windows in presence.items()
        for w in windows
    ]
    insert_requests(ch_client, ch_database, records)
    live = SteadyLedger(frozenset(), windows=3, keep=4)
    first_index = FIRST_WS // WINDOW_MS
    for w in range(12):
        live.observe(first_index + w, [t for t, ws in presence.items() if w in ws])
    newest = first_index + 11
    loaded = SteadyLedger(frozenset(), windows=3, keep=4)
    first, every_from = loaded.history_span(newest)
    history = steady_history(
        ch_client, ch_database, first * WINDOW_MS, newest * WINDOW_MS, every_from * WINDOW_MS, loaded.windows
    )
    assert sum(len(t) for t in history.values()) < len(records)  # the one-off ids no longer matter
    loaded.load({ws // WINDOW_MS: tenants for ws, tenants in history.items()})
    assert loaded.registered == live.registered == {"b"}
    assert loaded.promoted == live.promoted and loaded.runs == live.runs and loaded.last == live.last
    # Both go on alike: d's third window in a row promotes it.
    assert live.observe(newest + 1, ["d"]) and loaded.observe(newest + 1, ["d"])
    assert loaded.registered == live.registered == {"b", "d"}  # b has no run ending at 12, but is kept until 15
