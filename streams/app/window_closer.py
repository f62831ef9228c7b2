"""Closes event-time windows in the writer and derives their aggregates from the store.

A window closes when the writer's watermark (the join's heartbeats, or the wall clock once the writer's
polls have come back without a record for ``idle_close_s``) passes ``window_start + W + grace``. Its rows
are then computed from ``requests FINAL`` by the pure :func:`streams.core.windows.aggregate_window`,
written to the aggregate tables (idempotent: ReplacingMergeTree by window key) and published to
``ttft.stage-windows`` / ``ttft.window-health``.

A record for an already closed window is a late amendment: the window is computed again from the
store and the amendment counted. Because every computation reads the store, a crash, a replay or a
duplicate cannot double-count; at start-up, windows whose stored aggregates do not match the records
(count and sum of record versions) are computed again.

Two things keep a close off the writer's commit path (issue 13):

- The writer keeps its own copy of each open window's records (:mod:`streams.app.window_memory`). A close
  reads the store's fingerprint of the window (one ``count()``/``sum()``) and, when it matches the copy,
  aggregates the copy instead of reading every record back. Otherwise it reads the store, as before.
- With ``background=True`` (the live writer), closes, amendments and the rule engine's watermark calls
  run in order in one background task, and the aggregation runs in a close process (a held window) or on
  a thread (a window read from the store): the batch that made a window due is committed without waiting.
  A crash before the close is stored is the case start-up recovery already handles (the window's stored
  aggregates do not match its records).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import orjson

from streams.app.arms import arms_from_records
from streams.app.metrics import WorkerMetrics
from streams.app.shared_windows import RECONCILE_S, RECONCILE_WINDOWS, SharedProgress
from streams.app.window_handoff import release, spool
from streams.app.window_memory import (
    Serialised,
    WindowMemory,
    aggregate_held,
    aggregate_spooled,
    close_process_init,
)
from streams.core.series import SeriesAdmission
from streams.core.tenancy import SteadyLedger
from streams.core.watermarks import SourceWatermarks
from streams.core.windows import WindowAggregates, aggregate_window
from streams.settings import Settings
from streams.store.aggregates_store import (
    dead_letter_counts,
    insert_window_aggregates,
    request_window_fingerprints,
    stored_window_fingerprints,
    stored_window_series,
    window_fingerprint,
)
from streams.store.requests_store import fetch_window_records, steady_history, window_tenants

log = logging.getLogger("ttft.windows")

StoreCall = Callable[..., Awaitable[Any]]
Publish = Callable[[str, bytes, bytes], Awaitable[None]]
#: (window_start_ms, aggregates, first_close, arms) -> awaitable; the rule engine hooks in here.
WindowClosedHook = Callable[[int, WindowAggregates, bool, dict[Any, str]], Awaitable[None]]
#: (watermark_ms, open window starts) -> awaitable; lets the rules evaluate windows without records.
WatermarkHook = Callable[[float, set[int]], Awaitable[None]]

_CLOSED_MEMORY = 1_440  # windows remembered as closed (one day at W = 60 s)
#: Background jobs queued before a batch waits for them (back-pressure when closes fall behind).
_MAX_QUEUED_JOBS = 64
_STOP_DRAIN_S = 60.0

T = TypeVar("T")
Job = Callable[[], Awaitable[Any]]


class WindowCloser:
    """Event-time window bookkeeping of one writer."""

    def __init__(
        self,
        settings: Settings,
        metrics: WorkerMetrics,
        store_call: StoreCall,
        publish: Publish,
        clock: Callable[[], float] = time.time,
        *,
        background: bool = False,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store_call = store_call
        self.publish = publish
        self.clock = clock
        self.window_ms = settings.windows.window_s * 1000
        self.grace_ms = settings.windows.grace_s * 1000
        self.admission = SeriesAdmission.from_settings(settings)
        #: The registered tenants: configured, and promoted from the closed windows (streams.core.tenancy);
        #: the series admission and the rule engine's silence rule use them.
        self.tenants = SteadyLedger.from_settings(settings)
        self.open: set[int] = set()
        self.closed: dict[int, int] = {}  # window_start -> times computed after closing
        self.watermark: float | None = None
        self._max_started: float | None = None
        self.source_watermarks = SourceWatermarks(settings.partitions)
        self.request_partitions: list[int] = list(range(settings.partitions))
        #: Seconds spent polling since the last batch with records: only the polls' own waits count, never
        #: the time spent in the store (a long insert retry is an outage, not idleness).
        self._idle_s = 0.0
        join = settings.join
        self.idle_close_s = (
            settings.windows.idle_close_s
            if settings.windows.idle_close_s is not None
            else (join.request_timeout_ms + join.grace_ms) / 1000.0
        )
        self.hooks: list[WindowClosedHook] = []
        self.watermark_hooks: list[WatermarkHook] = []
        self.db = settings.clickhouse_database
        self.memory = WindowMemory(settings.windows.held_records_max)
        self.background = background
        self._cpu_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttft-windows")
        self._close_process: ProcessPoolExecutor | None = None
        #: Hand a window's held records to the close process in a spooled file (until that fails once).
        self._spool = True
        self._queue: asyncio.Queue[Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._last_watermark_call: tuple[float, frozenset[int]] | None = None
        #: Windows due and queued, not computed yet: still open for ``ttft_open_windows``.
        self.closing: set[int] = set()
        #: Every partition of ``ttft.requests`` (None: unknown, the writer is alone). When this writer owns
        #: only some of them, windows are closed by one owner (:mod:`streams.app.shared_windows`).
        self.all_partitions: set[int] | None = None
        self.shared: SharedProgress | None = None
        self.was_owner = True
        #: Called when this writer becomes the owner after another writer was (rebuild from the store).
        self.ownership_hooks: list[Callable[[], Awaitable[None]]] = []
        self._last_reconcile = 0.0

    # --- several writers ----------------------------------------------------------------------------

    def is_shared(self) -> bool:
        """This writer owns some, not all, partitions of ``ttft.requests``."""
        return self.all_partitions is not None and set(self.request_partitions) != self.all_partitions

    def is_owner(self) -> bool:
        """This writer closes windows and runs the rules: alone, or owning the lowest partition."""
        if not self.is_shared():
            return True
        assert self.all_partitions is not None
        return bool(self.all_partitions) and min(self.all_partitions) in self.request_partitions

    async def _cluster_progress(self) -> float | None:
        """The join's progress on every partition, as all writers recorded it (shared mode)."""
        if self.shared is None:
            self.shared = SharedProgress(self.store_call, self.db, self.metrics.worker_id)
        own = {p: value for p in self.request_partitions if (value := self.source_watermarks.progress([p])) is not None}
        assert self.all_partitions is not None
        return await self.shared.exchange(own, sorted(self.all_partitions))

    async def _reconcile(self) -> None:
        """Owner, shared mode: recompute recently closed windows whose records changed since (late records
        another writer inserted after the close)."""
        recent = sorted(self.closed)[-RECONCILE_WINDOWS:]
        if not recent:
            return
        have = await self.store_call(request_window_fingerprints, self.db, recent[0]) or {}
        done = await self.store_call(stored_window_fingerprints, self.db, recent[0]) or {}
        for ws in recent:
            if ws in have and done.get(ws) != have[ws]:
                self.closed[ws] += 1
                self.metrics.window_amendments.inc()
                await self._compute(ws, first_close=False)

    # --- start-up -------------------------------------------------------------------------------

    async def recover(self) -> None:
        """Compute again every window of the look-back whose stored aggregates are stale."""
        lookback_ms = self.settings.windows.recompute_lookback_s * 1000
        since = (self.clock() * 1000.0) - lookback_ms - 30 * 86_400_000  # event time may lag wall time
        have = await self.store_call(request_window_fingerprints, self.db, since)
        if not have:
            return
        latest = max(have)
        since = latest - lookback_ms
        done = await self.store_call(stored_window_fingerprints, self.db, since)
        self.watermark = float(latest)
        self._max_started = float(latest)
        for ws in sorted(w for w in have if w >= since):
            if done.get(ws) == have[ws]:
                self.closed[ws] = 0
            else:
                self.open.add(ws)
        log.info("window recovery: %d stale windows of %d", len(self.open), len(have))
        await self.load_tenants()

    async def load_tenants(self) -> None:
        """The promoted tenants as of the newest closed window, from the store's windows (the same rule as
        booking each window as it closes, so a restart keeps them)."""
        ledger = self.tenants
        ledger.reset()
        if ledger.windows > 0 and self.closed:
            w = self.window_ms
            newest = max(self.closed) // w
            first, every_from = ledger.history_span(newest)
            span = (first * w, newest * w, every_from * w, ledger.windows)
            history = await self.store_call(steady_history, self.db, *span)
            ledger.load({ws // w: tenants for ws, tenants in (history or {}).items()})
        self._tenants_changed()
        log.info("registered tenants: %d promoted, as of window %s", len(ledger.promoted), ledger.last)

    async def _book_tenants(self, ws: int) -> None:
        """Book a closing window's tenants for promotion, in window order (an older window: nothing)."""
        ledger = self.tenants
        index = ws // self.window_ms
        if ledger.windows <= 0 or (ledger.last is not None and index <= ledger.last):
            return
        before = set(ledger.promoted)
        if ledger.observe(index, await self.store_call(window_tenants, self.db, ws) or []):
            now = set(ledger.promoted)
            log.info(
                "window %d: tenants promoted %s, no longer promoted %s", ws, sorted(now - before), sorted(before - now)
            )
            self._tenants_changed()

    def _tenants_changed(self) -> None:
        self.admission = replace(self.admission, registered=self.tenants.registered)
        self.metrics.health["promoted_tenants"] = len(self.tenants.promoted)

    # --- per batch ------------------------------------------------------------------------------

    async def on_records(
        self,
        records: list[dict[str, Any]],
        *,
        polled_s: float,
        answered: bool = True,
        serialised: Serialised | None = None,
        vacated: Iterable[int] = (),
    ) -> None:
        """Book a committed batch of records and close what became due.

        ``polled_s``: how long the poll that brought this batch waited for messages. Without records (an
        empty poll, or one of dead letters or heartbeats only) it adds to the idle time; records reset it.
        ``answered``: False when the broker had not answered the writer's fetches (down, or cut off): the
        idle time restarts, as the join's does, since what the join emits meanwhile is on its way.
        ``serialised``: ``id(record) -> (record, the bytes it was decoded from)`` (see WindowMemory.add).
        ``vacated``: windows a stored request left in this batch (its start moved, e.g. a late
        request_start): a closed one is computed again like an amended one (an open one's close reads the
        store when the memory's copy no longer matches it).
        """
        self._raise_failure()
        now = self.clock()
        amended: set[int] = {ws for ws in vacated if ws in self.closed}
        held: list[dict[str, Any]] = []
        for record in records:
            ws = int(record["window_start"])
            started = float(record["started_at"])
            if self._max_started is None or started > self._max_started:
                self._max_started = started
            if ws in self.closed:
                amended.add(ws)
            else:
                self.open.add(ws)
                held.append(record)
        shared, owner = self.is_shared(), self.is_owner()
        if shared:  # this writer's copy would be partial: closes read the store
            self.memory.forget(self.memory.windows())
        else:
            self.memory.add(held, serialised)
        self.metrics.window_held_records.set(self.memory.held_records)
        self._idle_s = 0.0 if records or not answered else self._idle_s + max(0.0, polled_s)
        if self.all_partitions is not None and not self.request_partitions:
            return  # between assignments this writer owns nothing: it closes and judges nothing
        if owner and not self.was_owner:
            log.info(
                "this writer now owns partition %d: it closes windows and runs the rules", min(self.request_partitions)
            )
            for ownership_hook in self.ownership_hooks:
                await self._run(ownership_hook)
        self.was_owner = owner
        cluster = await self._cluster_progress() if shared else None
        self._advance_watermark(now, cluster if shared else None, shared)
        await self._close_due(compute=owner)
        self._count_open()
        if self.watermark is not None:
            self.metrics.watermark.set(self.watermark)
            if owner:
                await self._watermark_moved(self.watermark)
        if not owner:
            return  # the owner folds late records in when it reconciles
        for ws in sorted(amended):
            self.closed[ws] += 1
            self.metrics.window_amendments.inc()
            await self._run(functools.partial(self._compute, ws, first_close=False))
        if shared and now - self._last_reconcile >= RECONCILE_S:
            self._last_reconcile = now
            await self._run(self._reconcile)

    async def _watermark_moved(self, watermark: float) -> None:
        """The rule engine's watermark call, once per new (watermark, open windows) pair."""
        call = (watermark, frozenset(self.open))
        if call == self._last_watermark_call:
            return
        self._last_watermark_call = call
        for watermark_hook in self.watermark_hooks:
            await self._run(functools.partial(watermark_hook, watermark, set(self.open)))

    def _advance_watermark(self, now: float, cluster: float | None = None, shared: bool = False) -> None:
        """The writer's event time: how far every join partition has provably progressed.

        From the join's heartbeats (:mod:`streams.core.watermarks`): their minimum, less the join's request
        timeout and grace (a request may stay open that long before it is emitted). When the writer's polls
        waited ``windows.idle_close_s`` (default: that same timeout + grace) in all without bringing a record,
        the wall clock stands in, so a stopped join or historical traffic still closes its windows. Time spent
        blocked on the store is not idle time: after an outage the join's backlog is still to come. Nor is
        time the broker did not answer the writer's fetches: the idle time restarts once it answers again.

        With several writers (``shared``), the progress is ``cluster``: every partition's, as all writers
        recorded it.
        """
        join = self.settings.join
        settle_ms = join.request_timeout_ms + join.grace_ms + 2 * join.idle_tick_ms
        candidates: list[float] = []
        progress = cluster if shared else self.source_watermarks.progress(self.request_partitions)
        if progress is not None:
            candidates.append(progress - settle_ms)
        if self._max_started is not None and self._idle_s >= self.idle_close_s:
            candidates.append(now * 1000.0 - settle_ms)
        if candidates and (self.watermark is None or max(candidates) > self.watermark):
            self.watermark = max(candidates)

    async def _close_due(self, compute: bool = True) -> None:
        """Close the windows the watermark passed (``compute`` False: another writer closes them)."""
        if self.watermark is None:
            return
        due = sorted(ws for ws in self.open if ws + self.window_ms + self.grace_ms <= self.watermark)
        for ws in due:
            self.open.discard(ws)
            self.closed[ws] = 0
            if compute:
                self.closing.add(ws)
                await self._run(functools.partial(self._compute, ws, first_close=True))
        while len(self.closed) > _CLOSED_MEMORY:
            self.closed.pop(min(self.closed))

    async def flush_all(self) -> None:
        """Close every open window now (end of a bounded run, e.g. a replay or the demo) and wait."""
        for ws in sorted(self.open):
            self.open.discard(ws)
            self.closed[ws] = 0
            self.closing.add(ws)
            await self._run(functools.partial(self._compute, ws, first_close=True))
        await self.drain()

    # --- background -------------------------------------------------------------------------------

    async def _run(self, job: Job) -> None:
        """Run ``job`` now, or (background) after the jobs queued before it."""
        if not self.background:
            await job()
            return
        self._raise_failure()
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._work(self._queue), name="ttft-window-closer")
        self._queue.put_nowait(job)
        self.metrics.window_jobs_queued.set(self._queue.qsize())
        if self._queue.qsize() > _MAX_QUEUED_JOBS:
            await self.drain()

    async def _work(self, queue: asyncio.Queue[Job]) -> None:
        while True:
            job = await queue.get()
            try:
                await job()
            except Exception as exc:  # a bug: the next batch re-raises it and the writer exits uncommitted
                log.critical("window close failed; the writer stops and recovery recomputes it", exc_info=True)
                self._failure = exc
                return
            finally:
                queue.task_done()
                self.metrics.window_jobs_queued.set(queue.qsize())

    def pending_jobs(self) -> int:
        """Closes and rule calls queued for the background task."""
        return 0 if self._queue is None else self._queue.qsize()

    async def drain(self) -> None:
        """Wait until every queued job ran (raises what a failed one raised)."""
        if self._queue is not None and self._task is not None and not self._task.done():
            joined = asyncio.ensure_future(self._queue.join())
            await asyncio.wait({joined, self._task}, return_when=asyncio.FIRST_COMPLETED)
            joined.cancel()
        self._raise_failure()

    async def stop(self) -> None:
        """Finish the queued closes (bounded; what is left is recomputed by the next start's recovery)."""
        try:
            await asyncio.wait_for(self.drain(), _STOP_DRAIN_S)
        except TimeoutError:
            log.warning("window closes still queued at stop; the next start recomputes them")
        except RuntimeError:
            pass  # a failed close, logged when it failed; the next start recomputes the window
        finally:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            self._cpu_pool.shutdown(wait=False, cancel_futures=True)
            if self._close_process is not None:
                self._close_process.shutdown(wait=False, cancel_futures=True)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError("a window close failed") from self._failure

    async def _cpu(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Pure CPU work off the event loop (background mode), so commits go on meanwhile."""
        if not self.background:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._cpu_pool, functools.partial(fn, *args, **kwargs))

    # --- computing --------------------------------------------------------------------------------

    async def _held_blobs(self, ws: int, first_close: bool) -> list[bytes] | None:
        """The writer's copy of the window, when it matches the store's fingerprint (else None)."""
        held = self.memory.fingerprint(ws)
        blobs = self.memory.take(ws)
        self.metrics.window_held_records.set(self.memory.held_records)
        if blobs is None or not first_close:
            return None
        stored = await self.store_call(window_fingerprint, self.db, ws)
        if stored is not None and tuple(stored) == held:
            return blobs
        log.info("window %d: the writer's copy %s differs from the store's %s; reading the store", ws, held, stored)
        return None

    async def _aggregate(
        self, ws: int, first_close: bool, dead: Any, pinned: list[Any]
    ) -> tuple[WindowAggregates, dict[Any, str], str]:
        amendments = self.closed.get(ws, 0)
        blobs = await self._held_blobs(ws, first_close)
        if blobs is not None:
            args = (ws, self.settings, self.admission, dead, amendments, pinned)
            if self.background:  # another process: the writer's event loop and GIL stay free
                agg, arms = await self._in_close_process(blobs, args)
            else:
                agg, arms = aggregate_held(blobs, *args)
            return agg, arms, "memory"
        records = await self.store_call(fetch_window_records, self.db, ws, self.window_ms)
        agg = await self._cpu(
            aggregate_window,
            records,
            ws,
            self.settings,
            admission=self.admission,
            dead_letters=dead,
            amendments=amendments,
            pinned_series=pinned,
        )
        return agg, await self._cpu(arms_from_records, records, self.settings), "store"

    async def _in_close_process(self, blobs: list[bytes], args: tuple[Any, ...]) -> tuple[WindowAggregates, Any]:
        """:func:`aggregate_held` in the close process, the records handed over in a spooled file
        (:mod:`streams.app.window_handoff`), or pickled with the call where that is not possible."""
        loop = asyncio.get_running_loop()
        spooled = await loop.run_in_executor(self._cpu_pool, spool, blobs) if self._spool else None
        if spooled is not None:
            fd, handle = spooled
            try:
                return await loop.run_in_executor(self._process_pool(), aggregate_spooled, handle, *args)
            except OSError:  # the close process could not open the writer's file: pickle from now on
                log.warning("the close process cannot read spooled window records; passing them pickled", exc_info=True)
                self._spool = False
            finally:
                release(fd)
        return await loop.run_in_executor(self._process_pool(), aggregate_held, blobs, *args)

    def _process_pool(self) -> ProcessPoolExecutor:
        if self._close_process is None:
            self._close_process = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=close_process_init,
                initargs=(os.getpid(),),
            )
        return self._close_process

    async def _compute(self, ws: int, *, first_close: bool) -> WindowAggregates:
        started = time.perf_counter()
        if first_close:
            await self._book_tenants(ws)
        if self.admission.registered is not self.tenants.registered:  # the rule engine books empty windows too
            self._tenants_changed()
        dead = await self.store_call(dead_letter_counts, self.db, ws, ws + self.window_ms)
        pinned = await self.store_call(stored_window_series, self.db, ws) or []  # they keep their slots
        agg, arms, source = await self._aggregate(ws, first_close, dead, pinned)
        tables = {
            "stage_windows": agg.stage_windows,
            "stage_strata": agg.stage_strata,
            "tail_attribution": agg.tail_attribution,
            "window_health": agg.window_health,
            "llm_signals": agg.llm_signals,
        }
        await self.store_call(insert_window_aggregates, self.db, tables)
        await self._publish(ws, agg)
        self.metrics.windows_closed.inc()
        if agg.overflow_series:
            self.metrics.series_overflow.inc(agg.overflow_series)
        if agg.folded_custom_stages:
            self.metrics.caps_tripped.labels("custom_stages_per_tenant").inc(agg.folded_custom_stages)
        if agg.folded_routes:
            self.metrics.caps_tripped.labels("routes_per_tenant").inc(agg.folded_routes)
        for hook in self.hooks:
            await hook(ws, agg, first_close, arms)
        self.metrics.window_close_seconds.labels(source).observe(time.perf_counter() - started)
        if first_close:
            self.closing.discard(ws)
            self._count_open()
        return agg

    def _count_open(self) -> None:
        """``ttft_open_windows``: windows with records not aggregated yet (open, or due and queued)."""
        self.metrics.open_windows.set(len(self.open | self.closing))

    async def _publish(self, ws: int, agg: WindowAggregates) -> None:
        opts = orjson.OPT_NON_STR_KEYS
        topic = self.settings.topic("stage-windows")
        for row in agg.stage_windows:
            key = f"{row['tenant_id']}|{row['version_id']}|{row['stage']}|{ws}".encode()
            await self.publish(topic, key, orjson.dumps(row, option=opts))
        topic = self.settings.topic("window-health")
        signals = {(r["tenant_id"], r["version_id"]): r for r in agg.llm_signals}
        attribution = {(r["tenant_id"], r["version_id"]): r for r in agg.tail_attribution}
        for row in agg.window_health:
            series = (row["tenant_id"], row["version_id"])
            message = {**row, "llm_signals": signals.get(series), "tail_attribution": attribution.get(series)}
            key = f"{series[0]}|{series[1]}|{ws}".encode()
            await self.publish(topic, key, orjson.dumps(message, option=opts))
