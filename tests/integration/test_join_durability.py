"""Issue 13's two durability tests for the batch join (``join.consumer: batch``), on the real broker.

The unit versions with fake clients are in tests/unit/test_batch_join.py; these run ``ttft worker --role
join`` subprocesses against the session's Kafka broker and read ``ttft.requests`` back without a group.

1. A failing flush in the idle tick loses no record: the produce of the records that only the idle tick
   releases fails (``TTFT_FAULT_PRODUCE_FAIL_FILE``), the worker exits with its events already committed,
   and its replacement emits every request from the changelog state.
2. A short read cannot commit past unread records. The Faust adapter's gap repair (whose timed-out read
   filed a whole range as read) is gone: the batch join folds exactly what ``getmany`` returned and commits
   one past the last record folded. Its short reads are fetches capped at ``join.batch_max`` over a
   backlog; a partition changes hands at its committed offset when a worker leaves mid-backlog. The test
   samples the group's committed offsets against what the workers report folded, and checks that the new
   owner skipped nothing. (Records fetched for a partition before its state is restored are the other
   short-read case; aiokafka 0.14 never returns them — it drops fetched records of a partition that is
   paused or has no valid position yet, and ``assigned`` pauses before its first await — so only the unit
   test reaches ``_refetch_later``.)
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from streams.core.watermarks import WATERMARK_KEY
from streams.ports import free_port
from tests.integration.test_scaleout import owned_partitions
from tests.support.pipeline import Pipeline, WorkerProcess, group_lag, pipeline_env, produce_sync, read_topic
from tests.support.traffic import Traffic, build_traffic, wrong_values

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


def request_records(settings: Any) -> list[dict[str, Any]]:
    """Every request record in ``ttft.requests`` (heartbeats left out), in no particular order."""
    pairs = asyncio.run(read_topic(settings.kafka_bootstrap, settings.topic("requests")))
    return [orjson.loads(value) for key, value in pairs if key != WATERMARK_KEY]


def check_records(records: Sequence[dict[str, Any]], traffic: Traffic, *, exactly_once: bool) -> None:
    """Each request of the traffic once (``exactly_once``: once in the topic, else once after keeping the
    highest ``record_version`` of each), nothing else, and every record equal to the ground truth."""
    copies = Counter((r["tenant_id"], r["request_id"]) for r in records)
    if exactly_once:
        twice = [key for key, n in copies.items() if n > 1]
        assert not twice, f"{len(twice)} requests emitted more than once, e.g. {twice[:5]}"
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        key = (record["tenant_id"], record["request_id"])
        if key not in latest or record["record_version"] > latest[key]["record_version"]:
            latest[key] = record
    want = {(t["tenant_id"], rid) for rid, t in traffic.truth.items()}
    lost, extra = sorted(want - set(latest)), sorted(set(latest) - want)
    assert not lost and not extra, f"lost {len(lost)} (e.g. {lost[:5]}), unexpected {len(extra)} (e.g. {extra[:5]})"
    wrong = wrong_values({rid: got for (_, rid), got in latest.items()}, traffic.truth)
    assert not wrong, f"{len(wrong)} wrong values, e.g. {wrong[:10]}"


# --- 1. a failing flush in the idle tick --------------------------------------------------------------

IDLE_REQUESTS = 200
IDLE_GRACE_MS = 4_000


@pytest.mark.timeout(180)
def test_a_failing_flush_in_the_idle_tick_loses_no_record(kafka_settings: Any, tmp_path: Path) -> None:
    """Complete requests whose release waits for the idle tick (grace longer than the traffic's event-time
    span, so no event's watermark releases any); every event is folded and committed, then the idle tick's
    produce of their records fails. The worker must exit with those requests still open in its changelog
    (records before state), so the next worker emits each of them: nothing lost, nothing twice."""
    traffic = build_traffic(
        IDLE_REQUESTS,
        start_ms=time.time() * 1000 - 5_000,
        spacing_ms=1.0,
        missing_share=0.0,
        orphan_share=0.0,
        malformed_share=0.0,
        prefix="idle",
    )
    stamps = [orjson.loads(v) for _, v in traffic.messages]
    first_release = min(e["ts_ms"] for e in stamps if e["stage"] == "first_token") + IDLE_GRACE_MS
    assert max(e["ts_ms"] for e in stamps) < first_release - 500, "some event would release a request itself"

    marker = tmp_path / "fail-produce"
    marker.touch()
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_JOIN__CONSUMER="batch",
        TTFT_JOIN__GRACE_MS=str(IDLE_GRACE_MS),
        TTFT_FAULT_PRODUCE_FAIL_FILE=str(marker),
    )
    pipe = Pipeline(env, tmp_path)
    b, topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    group = f"app-{kafka_settings.topic_prefix}-join"
    started = time.monotonic()
    try:
        first = pipe.start("join", free_port(), worker_id="join-first")
        pipe.wait_healthy(first)
        produce_sync(b, topic, traffic.messages)
        try:
            rc = first.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the join did not exit on the failed flush:\n{first.log()[-3000:]}") from None
        died_after = time.monotonic() - started
        log = first.log()
        assert rc == 1, f"the join exited rc={rc}, not on the failed batch:\n{log[-3000:]}"
        assert "injected produce failure" in log and "join batch failed" in log, log[-3000:]
        # Every event had been folded and committed before the failure, so the failing batch fetched nothing:
        # it was the idle tick's flush. And none of its records reached the topic.
        assert group_lag(b, group, [topic]) == 0
        assert request_records(kafka_settings) == []

        marker.unlink()
        second = pipe.start("join", free_port(), worker_id="join-second")
        pipe.wait_healthy(second)
        pipe.wait_for(
            lambda: second.metric("ttft_records_emitted_total") >= IDLE_REQUESTS,
            60,
            "the replacement to emit every request",
        )
        assert second.metric("ttft_events_consumed_total") == 0  # from the changelog, not by re-reading
        assert pipe.stop(second) == 0
    finally:
        pipe.stop_all()
    print(f"\nfirst worker died on the injected failure {died_after:.1f} s in; {time.monotonic() - started:.1f} s")
    check_records(request_records(kafka_settings), traffic, exactly_once=True)


# --- 2. a short read cannot commit past unread records ------------------------------------------------

BACKLOG_REQUESTS = 4_000
BATCH_MAX = 200
STOP_AFTER_PARTIAL = 8


class CommitSampler(threading.Thread):
    """Samples the join group's committed offsets, then what each worker reports folded and owns, until
    stopped. A commit past unread records shows as a committed total above the folded total (folding
    precedes committing, so under the rule the committed total, read first, never exceeds it).

    ``stop_part_way``: the index of a worker to stop (SIGTERM) once it committed part of a partition it
    owns and not all of it (and ``STOP_AFTER_PARTIAL`` samples saw short reads committed), so that
    partition changes hands with records unread. From then on the folded total is no
    longer known (the stopping worker still commits its batch in flight), so the totals are compared no more.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int, ends: dict[int, int]) -> None:
        super().__init__(name="commit-sampler", daemon=True)
        self.bootstrap, self.group, self.ends = bootstrap, group, ends
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.workers: list[WorkerProcess] = []
        self.stop_part_way: int | None = None
        #: (partition, committed offset) the worker was stopped at
        self.stopped_at: tuple[int, int] | None = None
        self.stopped = threading.Event()
        #: samples whose totals were compared, and those in which some partition was committed part-way
        self.samples = 0
        self.partial = 0
        self.violations: list[str] = []
        #: partitions that changed owner while committed part-way: the new owner had unread records to fetch
        self.handovers: list[str] = []
        #: what each worker last reported folded
        self.folded: list[float] = []
        self._owner: dict[int, int] = {}
        self._last: dict[int, int] = {}
        #: per partition, its committed offset when its present owner took it over
        self._taken_at: dict[int, int] = {}
        self.error: BaseException | None = None
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join(30)

    def stopped_worker(self) -> bool:
        """The worker ``stop_part_way`` was told to stop. Raises at once on a commit past what was folded,
        and with what ended the sampler, if anything did."""
        assert not self.violations, f"committed past what was folded: {self.violations[:3]}"
        if self.error is not None:
            raise AssertionError(f"the sampler failed: {self.error!r}") from self.error
        return self.stopped.is_set()

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # the test owns the assertion
            self.error = exc

    async def _run(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            while not self._done.is_set():
                await self._sample(admin)
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    async def _sample(self, admin: AIOKafkaAdminClient) -> None:
        try:
            offsets = await admin.list_consumer_group_offsets(self.group, partitions=self.tps)
        except KafkaError as exc:  # e.g. no coordinator before the group's first member: no sample
            if not exc.retriable:
                raise
            return
        committed = {tp.partition: max(m.offset, 0) for tp, m in offsets.items()}
        workers = list(self.workers)
        live = [not self.stopped.is_set() or i != self.stop_part_way for i in range(len(workers))]
        try:
            folded = [
                w.metric("ttft_events_consumed_total") if ok else 0.0 for w, ok in zip(workers, live, strict=True)
            ]
            owned = [owned_partitions(w) if ok else set() for w, ok in zip(workers, live, strict=True)]
        except OSError:  # a worker starting: no sample
            return
        self.folded = [max(f, self.folded[i] if i < len(self.folded) else 0.0) for i, f in enumerate(folded)]
        if not self.stopped.is_set():
            self.samples += 1
            if sum(committed.values()) > sum(folded):
                self.violations.append(f"committed {sum(committed.values())} > folded {sum(folded):.0f}: {committed}")
            if any(0 < c < self.ends[p] for p, c in committed.items()):
                self.partial += 1
        self._track_owners(owned, committed)
        target = self.stop_part_way
        # Not before STOP_AFTER_PARTIAL samples compared commits part-way (short reads) with what was folded.
        if target is not None and self.partial >= STOP_AFTER_PARTIAL and not self.stopped.is_set():
            part_way = [
                p
                for p in sorted(owned[target])
                if self._owner.get(p) == target and self._taken_at[p] < committed[p] < self.ends[p]
            ]
            if part_way:
                workers[target].proc.send_signal(signal.SIGTERM)
                self.stopped_at = (part_way[0], committed[part_way[0]])
                self.stopped.set()

    def _track_owners(self, owned: list[set[int]], committed: dict[int, int]) -> None:
        for partition in range(len(self.tps)):
            holders = [i for i, parts in enumerate(owned) if partition in parts]
            if len(holders) != 1:
                continue  # a rebalance in progress (a revoked worker still lists it)
            before = self._owner.get(partition)
            if before != holders[0]:
                self._taken_at[partition] = committed[partition]
            if before is not None and before != holders[0] and 0 < self._last[partition] < self.ends[partition]:
                self.handovers.append(f"{partition}@{self._last[partition]}/{self.ends[partition]}")
            self._owner[partition] = holders[0]
            self._last[partition] = committed[partition]


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: int(offset) for tp, offset in ends.items()}
    finally:
        await consumer.stop()


@pytest.mark.timeout(240)
def test_a_short_read_cannot_commit_past_unread_records(kafka_settings: Any, tmp_path: Path) -> None:
    """A backlog read in fetches of at most ``BATCH_MAX`` records, so partitions are committed part-way.
    Two join workers share it; the second is stopped as soon as it committed part of a partition (a
    rebalance): that partition changes hands at its committed offset with records unread.
    While both run, the group never commits past what the workers folded; afterwards every request is in
    the topic, equal to the ground truth (so the new owners skipped nothing)."""
    traffic = build_traffic(
        BACKLOG_REQUESTS,
        start_ms=time.time() * 1000 - 120_000,
        spacing_ms=2.0,
        missing_share=0.0,
        orphan_share=0.0,
        prefix="short",
    )
    total = len(traffic.messages)
    b, topic = kafka_settings.kafka_bootstrap, kafka_settings.topic("stage-events")
    group = f"app-{kafka_settings.topic_prefix}-join"
    # State and offsets after every fetch (state_every_ms=0), so the partitions are committed part-way often.
    env = pipeline_env(
        kafka_settings,
        tmp_path,
        TTFT_JOIN__CONSUMER="batch",
        TTFT_JOIN__BATCH_MAX=str(BATCH_MAX),
        TTFT_JOIN__STATE_EVERY_MS="0",
    )
    pipe = Pipeline(env, tmp_path)
    assert produce_sync(b, topic, traffic.messages) == total  # the backlog, before any join worker
    ends = asyncio.run(_end_offsets(b, topic, kafka_settings.partitions))
    sampler = CommitSampler(b, group, topic, kafka_settings.partitions, ends)
    started = time.monotonic()
    try:
        # Two join workers one after the other on the backlog: whichever joins the group second moves
        # partitions by a rebalance, and the second is stopped once it committed part of a partition.
        # The sampler knows both before either can commit (it skips samples until both answer).
        first = pipe.start("join", free_port(), worker_id="join-first")
        second = pipe.start("join", free_port(), worker_id="join-second")
        sampler.workers += [first, second]
        sampler.stop_part_way = 1
        sampler.start()
        pipe.wait_healthy(first)
        pipe.wait_for(sampler.stopped_worker, 60, "the second worker to commit part of a partition")
        assert second.proc.wait(timeout=30) == 0
        pipe.wait_for(
            lambda: group_lag(b, group, [topic]) == 0 and first.metric("ttft_open_requests") == 0,
            120,
            "the first worker to drain the backlog",
        )
        sampler.stop()
        consumed_first = first.metric("ttft_events_consumed_total")
        assert pipe.stop(first) == 0
    finally:
        sampler.stop()
        pipe.stop_all()
    print(
        f"\n{total} events; the first worker folded {consumed_first:.0f}, the second at least "
        f"{sampler.folded[1]:.0f}, stopped with a partition committed part-way (partition, offset) "
        f"{sampler.stopped_at}; {sampler.samples} samples compared, {sampler.partial} with a "
        f"partition committed part-way; handed over part-way: {sampler.handovers}; "
        f"{time.monotonic() - started:.1f} s"
    )
    assert sampler.error is None, sampler.error
    assert not sampler.violations, sampler.violations[:5]
    # Not vacuous: short reads were committed part-way through partitions, and partitions changed hands
    # with records still unread, which their new owner fetched from the committed offset.
    assert sampler.partial >= STOP_AFTER_PARTIAL
    assert sampler.handovers, "no partition changed hands part-way"
    assert sampler.folded[1] > 0
    check_records(request_records(kafka_settings), traffic, exactly_once=False)
