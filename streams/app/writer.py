"""The store writer: ``ttft.requests`` and ``ttft.dead-letter`` -> ClickHouse, committed after the insert.

:class:`StoreWriter` is the writer's fold of the partition-batch runner (:mod:`streams.kafka.batches`,
consumer group ``<app_id>-writer``; a Faust agent under ``ttft worker``, :mod:`streams.app.agents`): the
runner commits exactly the offsets of the fetch the fold inserted, after it returned (no single-offset
holes, faust-streaming#606).

Invariants:
- Offsets are committed only after every row of the batch is in ClickHouse or in ``dead_letters``. An
  infrastructure error is retried with back-off for as long as it takes; nothing is acknowledged away. A
  deterministic error (a value the columns cannot hold, :mod:`streams.store.reject`) is isolated to its
  rows, which are dead-lettered ``store_rejected`` with their original bytes; the rest is stored.
- Inserts are idempotent: ``requests`` keeps the most complete version per (tenant_id, request_id), ``dead_letters``
  one row per (topic, partition, offset). A replay after a crash changes nothing.
- Amendment records (late events of a forgotten request) are merged into the stored row.
- Every ``STATS_INTERVAL_S`` the writer samples its own metrics into ``pipeline_stats`` (the health
  dashboard's lag and insert-latency panels). Best effort: a failed write is logged and dropped, and it
  never blocks, retries or stops the record path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from clickhouse_connect.driver.exceptions import ClickHouseError
from pydantic import ValidationError

from schemas.dead_letter import DeadLetter, DeadLetterReason, make_dead_letter
from schemas.decode import schema_error_summary
from schemas.records import RequestRecord
from streams.app.metrics import WorkerMetrics
from streams.app.stats import STATS_INTERVAL_S, JoinStats, StatsReporter
from streams.app.store_outage import HaltPage, StoreOutage
from streams.core.join import merge_records
from streams.core.watermarks import WATERMARK_KEY
from streams.kafka.batches import (
    Emit,
    Outputs,
    PartitionBatchRunner,
    PartitionView,
    Records,
    Report,
    RunnerConfig,
    RunnerMetrics,
    Submit,
)
from streams.kafka.unreadable import unreadable_letter
from streams.settings import Settings
from streams.store.client import StoreUnavailable, make_client
from streams.store.dead_letter_store import insert_dead_letters
from streams.store.migrate import apply_migrations
from streams.store.requests_store import (
    apply_amendments_checked,
    insert_requests_checked,
    request_key,
    stored_windows,
    vacated_windows,
)

log = logging.getLogger("ttft.writer")
#: A request record from its message's bytes, checked against the contract in one pass.
_validate_record = RequestRecord.__pydantic_validator__.validate_json

#: Store failures worth waiting out: the server or the network, never a bug in our code.
RETRIABLE: tuple[type[BaseException], ...] = (ClickHouseError, StoreUnavailable, OSError, TimeoutError)

#: How long the live writer keeps polling after the first records of a fetch. A join flush reaches the
#: writer over several fetches (one per partition leader response); each insert has a fixed cost in the
#: store (a new part: ~15 ms of CPU in chDB whatever its size), so one insert for what arrives together is
#: cheaper than one per fetch. Nothing is committed before its insert; rows become visible at most this later.
LINGER_MS = 50

#: Called after each poll: with the inserted records once the batch is committed, with ``[]`` after an
#: empty poll (window closing hooks in here; ``StoreWriter.last_poll_s`` is how long that poll waited).
BatchHook = Callable[[list[dict[str, Any]]], Any]
#: ``store_call(fn, *args)`` runs ``fn(client, *args)`` on the store thread.
StoreCall = Callable[..., Awaitable[Any]]


def _nothing_to_report() -> None:
    """The writer's gauges are set where it works (its hooks), not per fold."""


class StoreWriter:
    """Consumes joined records and dead letters and writes them to ClickHouse in batches."""

    def __init__(
        self,
        settings: Settings,
        metrics: WorkerMetrics,
        *,
        batch_max: int = 10_000,
        batch_timeout_ms: int = 200,
        linger_ms: int = 0,
        fault_injector: Callable[[], None] | None = None,
        stats_interval_s: float | None = STATS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        submit: Submit | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttft-store")
        self.client: Any = None
        self.hooks: list[BatchHook] = []
        self.on_stop: list[Callable[[], Any]] = []
        #: Join watermark heartbeats (source partition, requests partition, ms) read since the last hook.
        self.heartbeats: list[tuple[int, int, float]] = []
        #: Windows a stored request left since the last hook (its start moved): computed again if closed.
        self.vacated: set[int] = set()
        #: While the hooks run: ``id(record) -> (record, message bytes)`` of each record decoded from a
        #: message (a record merged from amendments has none). The window memory keeps these bytes instead
        #: of encoding the record again; the record is held so that its id cannot be reused meanwhile.
        self.batch_values: dict[int, tuple[dict[str, Any], bytes]] = {}
        self._fault = fault_injector
        #: True while a store call is failing and being retried (cleared by the next success).
        self.store_failing = False
        #: The store refusing every call for ``caps.store_halt_page_s``: ``halt_page`` pages it (writer_hooks).
        self.outage = StoreOutage(settings.caps.store_halt_page_s, clock)
        self.halt_page: HaltPage | None = None
        #: The join workers' gauges, as their heartbeats carry them.
        self.join_stats = JoinStats(self.settings.topic("stage-events"))
        #: ``pipeline_stats`` samples every ``stats_interval_s`` while running (None: none).
        self.stats: StatsReporter | None = None
        if stats_interval_s is not None:
            self.stats = StatsReporter(
                metrics,
                self.store_once,
                settings.clickhouse_database,
                owned=self.owned_partitions,
                store_down=lambda: self.store_failing,
                interval_s=stats_interval_s,
                join_samples=self.join_stats.samples,
            )
        self.requests_topic = settings.topic("requests")
        self.dead_letter_topic = settings.topic("dead-letter")
        config = RunnerConfig(
            name="writer",
            group_id=f"{settings.app_id}-writer",
            topics=(self.requests_topic, self.dead_letter_topic),
            batch_max=batch_max,
            poll_ms=batch_timeout_ms,
            linger_ms=linger_ms,
            fetch_max_bytes=16 * 1_048_576,
            max_partition_fetch_bytes=8 * 1_048_576,
            max_poll_interval_ms=3_600_000,  # a store outage is waited out with the fetch uncommitted
            owns_partitions=False,
        )
        runner_metrics = RunnerMetrics(
            unacked=metrics.unacked_records,
            batches=metrics.batches,
            lag=metrics.consumer_lag,
            refused=metrics.produce_refused.labels("batch"),
            health=metrics.health,
        )
        #: Consume → this fold → commit; ``submit`` is where the Faust agent takes the fetch (streams/app/agents.py).
        self.runner = PartitionBatchRunner(
            settings, config, self, metrics=runner_metrics, submit=submit, monotonic=clock
        )

    async def _in_store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a blocking store call on the single store thread (chDB wants one writer thread)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, fn, *args)

    async def on_store_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store thread, queued behind the store calls already submitted (the store's
        HTTP interface runs its reads here: chDB handles are not shared between threads)."""
        return await self._in_store(fn, *args)

    async def store_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(client, *args)`` on the store thread, retried until it succeeds."""
        return await self._retry(getattr(fn, "__name__", "store call"), lambda: fn(self.client, *args))

    async def store_once(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(client, *args)`` on the store thread, tried once: errors go to the caller (for stats)."""
        return await self._in_store(fn, self.client, *args)

    async def start(self) -> None:
        self.client = await self._retry("connect", lambda: make_client(self.settings))
        applied = await self._retry("migrate", lambda: apply_migrations(self.client, self.settings.clickhouse_database))
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))
        await self.runner.start()

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The runner's group consumer (``<app_id>-writer``)."""
        return self.runner.consumer

    @consumer.setter
    def consumer(self, consumer: AIOKafkaConsumer | None) -> None:
        self.runner.consumer = consumer

    @property
    def last_poll_s(self) -> float:
        """Seconds the latest poll waited for messages: the window closer's idle clock counts only these,
        never the time spent in the store (see WindowCloser.on_records)."""
        return self.runner.last_poll_s

    @property
    def last_poll_answered(self) -> bool:
        """Whether the broker answered this writer's fetches when the latest poll returned: a poll it did
        not answer (an outage) restarts the window closer's idle time instead of adding to it."""
        return self.runner.last_poll_answered

    def request_partitions(self) -> list[int]:
        """The ``ttft.requests`` partitions this writer currently owns."""
        if self.consumer is None:
            return []
        return sorted(tp.partition for tp in self.consumer.assignment() if tp.topic == self.requests_topic)

    def all_request_partitions(self) -> set[int] | None:
        """Every partition of ``ttft.requests`` (None until the consumer knows the topic)."""
        if self.consumer is None:
            return None
        partitions = self.consumer.partitions_for_topic(self.requests_topic)
        return set(partitions) if partitions else None

    def owned_partitions(self) -> set[tuple[str, int]]:
        """(topic, partition) of everything this writer currently owns."""
        if self.consumer is None:
            return set()
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    async def stop(self) -> None:
        """Finish the batch in flight (it is committed or not at all), then leave the group."""
        self.runner.stop()

    async def run(self) -> None:
        """Run the batches through this fold until :meth:`stop`, then the stop hooks, then leave the group."""
        stopping = asyncio.Event()
        stats = asyncio.create_task(self.stats.run(stopping)) if self.stats is not None else None
        try:
            await self.runner.run(close=False)
        finally:
            stopping.set()
            if stats is not None:
                stats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stats
            for fn in self.on_stop:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            await self.runner.close()
            self.executor.shutdown(wait=True)

    # --- BatchFold --------------------------------------------------------------------------------

    async def fold(self, records: Records, now_ms: float, view: PartitionView, emit: Emit) -> None:
        """Insert a fetch (or run the idle hooks after an empty poll); the runner commits it afterwards."""
        if records:
            await self._process(records)
        else:
            await self._idle()

    def take_dirty(self) -> Outputs:
        return {}

    async def restore(self, partitions: list[TopicPartition]) -> None:
        return None

    def revoke(self, partitions: set[TopicPartition]) -> None:
        return None

    def report(self) -> Report:
        return _nothing_to_report

    async def _idle(self) -> None:
        for hook in self.hooks:
            result = hook([])
            if asyncio.iscoroutine(result):
                await result

    async def _process(self, batch: Records) -> None:
        records: list[dict[str, Any]] = []
        amendments: list[dict[str, Any]] = []
        dead_letters: list[dict[str, Any]] = []
        heartbeats: list[tuple[int, int, float]] = []
        #: id(record) -> (record, where it came from); holding the record keeps its id unique in the batch.
        sources: dict[int, tuple[dict[str, Any], TopicPartition, Any]] = {}
        malformed = 0
        for tp, messages in batch.items():
            for msg in messages:
                if msg.value is None:  # a tombstone, or the runner's stand-in for a record it cannot read
                    letter = unreadable_letter(msg, time.time() * 1000.0, self.settings.caps.dead_letter_bytes)
                    if letter is not None:
                        dead_letters.append(letter.model_dump())
                    continue
                try:
                    if tp.topic == self.dead_letter_topic:
                        dead_letters.append(DeadLetter.model_validate_json(msg.value).model_dump())
                        continue
                    if msg.key == WATERMARK_KEY:
                        beat = orjson.loads(msg.value)
                        heartbeats.append((int(beat["source_partition"]), tp.partition, float(beat["watermark_ms"])))
                        self.join_stats.observe(beat)
                        continue
                    # The record contract checked here, once: a message that is not a record (another producer
                    # on the topic, a bug) must not reach the store, the windows or the rules.
                    value = dict(_validate_record(msg.value).__dict__)
                except (ValueError, TypeError, KeyError, AttributeError) as exc:  # ValidationError is a ValueError
                    dead_letters.append(self._malformed_letter(tp, msg, exc))
                    malformed += 1
                    continue
                sources[id(value)] = (value, tp, msg)
                if value.get("amend"):
                    amendments.append(value)
                else:
                    records.append(value)
        if malformed:
            log.error("%d messages on %s were not request records (dead-lettered)", malformed, self.requests_topic)
        records = _keep_most_complete(records)
        db = self.settings.clickhouse_database
        # Where the late ones were stored before this batch: a request whose start moved (request_start came
        # late) leaves its old window, which then needs computing again (WindowCloser.on_records, vacated).
        late_keys = {request_key(r) for r in records if r.get("late_events")} | {request_key(a) for a in amendments}
        before = (
            await self._retry("read stored windows", lambda: stored_windows(self.client, db, late_keys))
            if late_keys
            else {}
        )
        refused: list[tuple[dict[str, Any], str]] = []
        if records:
            refused += await self._insert("requests", insert_requests_checked, db, records)
            records = _without(records, refused)
            self.metrics.records_written.inc(len(records))
        if amendments:
            window_ms = self.settings.windows.window_s * 1000
            merged, refused_amendments = await self._insert(
                "requests", apply_amendments_checked, db, amendments, lambda s, a: merge_records(s, a, window_ms)
            )
            refused += refused_amendments
            records.extend(merged)
        if refused:
            dead_letters += [self._refused_letter(r, reason, sources) for r, reason in refused]
            self.metrics.rows_refused.labels("requests").inc(len(refused))
            log.error(
                "the store refused %d request rows (dead-lettered store_rejected): %s", len(refused), refused[0][1]
            )
        if dead_letters:
            await self._insert("dead_letters", insert_dead_letters, db, dead_letters)
            self.metrics.dead_letters_written.inc(len(dead_letters))
        self.heartbeats.extend(heartbeats)
        self.vacated.update(vacated_windows(before, records))
        self.batch_values = {id(value): (value, msg.value or b"") for value, _, msg in sources.values()}
        try:
            for hook in self.hooks:
                result = hook(records)
                if asyncio.iscoroutine(result):
                    await result
        finally:
            self.batch_values = {}

    def _malformed_letter(self, tp: TopicPartition, msg: Any, exc: Exception) -> dict[str, Any]:
        """The dead letter of a message the writer cannot read: ``invalid_json`` when it is not JSON, else
        ``schema`` (not a record, heartbeat or dead letter as the contract has them)."""
        value = bytes(msg.value)
        try:
            orjson.loads(value)
            reason: DeadLetterReason = "schema"
        except orjson.JSONDecodeError:
            reason = "invalid_json"
        detail = schema_error_summary(exc) if isinstance(exc, ValidationError) else f"{type(exc).__name__}: {exc}"
        what = "dead letter" if tp.topic == self.dead_letter_topic else "request record"
        if msg.key == WATERMARK_KEY:
            what = "watermark heartbeat"
        return make_dead_letter(
            reason,
            f"not a {what}: {detail}",
            value,
            topic=tp.topic,
            partition=tp.partition,
            offset=msg.offset,
            kafka_timestamp_ms=msg.timestamp if msg.timestamp is not None and msg.timestamp >= 0 else None,
            max_original_bytes=self.settings.caps.dead_letter_bytes,
            received_at_ms=time.time() * 1000.0,
        ).model_dump()

    def _refused_letter(
        self,
        record: dict[str, Any],
        reason: str,
        sources: dict[int, tuple[dict[str, Any], TopicPartition, Any]],
    ) -> dict[str, Any]:
        """The ``store_rejected`` dead letter of a record the store refused (its own message's bytes)."""
        _, tp, msg = sources[id(record)]
        letter = make_dead_letter(
            "store_rejected",
            f"the store refused the row: {reason}",
            msg.value or b"",
            topic=tp.topic,
            partition=tp.partition,
            offset=msg.offset,
            kafka_timestamp_ms=msg.timestamp if msg.timestamp is not None and msg.timestamp >= 0 else None,
            max_original_bytes=self.settings.caps.dead_letter_bytes,
            received_at_ms=time.time() * 1000.0,
            request_id=str(record.get("request_id")),
            tenant_id=str(record.get("tenant_id")),
        )
        return letter.model_dump()

    async def _insert(self, table: str, fn: Callable[..., Any], *args: Any) -> Any:
        def call() -> Any:
            if self._fault is not None:
                self._fault()
            return fn(self.client, *args)

        started = time.perf_counter()
        result = await self._retry(f"insert into {table}", call)
        self.metrics.insert_seconds.labels(table).observe(time.perf_counter() - started)
        return result

    async def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` on the store thread until it succeeds, backing off up to 10 s between tries.

        Only infrastructure errors are retried; anything else is a bug and propagates (the writer exits
        without committing, and a restart replays the batch).
        """
        delay = 0.2
        while True:
            try:
                result = await self._in_store(fn)
            except RETRIABLE as exc:  # the batch stays unacknowledged while we wait
                self.store_failing = True
                self.metrics.insert_failures.inc()
                self.metrics.health["last_store_error"] = f"{what}: {type(exc).__name__}"
                log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay)
                if self.outage.failed():
                    detail = (
                        f"the store has refused every call for {self.outage.seconds:.0f} s ({what}: "
                        f"{type(exc).__name__}); the writer retries and commits nothing until it accepts them"
                    )
                    await self._page("firing", detail)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            else:
                self.store_failing = False
                if self.outage.succeeded():
                    await self._page("resolved", "")
                return result

    async def _page(self, state: str, detail: str) -> None:
        """Page the store outage (best effort: a broker that is down too must not stop the retries)."""
        if self.halt_page is None:
            return
        try:
            await self.halt_page(state, detail)
        except Exception:
            log.exception("could not produce the TTFTIngestHalted %s transition", state)


def _keep_most_complete(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Within one batch, keep one record per (tenant_id, request_id): the highest record_version."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        key = request_key(r)
        cur = best.get(key)
        if cur is None or r["record_version"] >= cur["record_version"]:
            best[key] = r
    return list(best.values())


def _without(records: list[dict[str, Any]], refused: list[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
    """``records`` minus the refused ones (by identity): they are in ``dead_letters``, not in any window."""
    gone = {id(r) for r, _ in refused}
    return [r for r in records if id(r) not in gone] if gone else records
