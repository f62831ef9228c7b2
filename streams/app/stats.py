"""Worker gauges as ``pipeline_stats`` rows (the health dashboard's lag, latency and open-request panels).

The writer is the only process with the store (chDB allows one writer), so it writes its own gauges and
the join workers' gauges, which their watermark heartbeats carry (``streams/app/join_fold.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from streams.app.metrics import WorkerMetrics
from streams.store.stats_store import (
    CONSUMER_LAG,
    CUT_OFF_TRACES,
    EVICTIONS,
    INSERT_LATENCY_MS,
    OPEN_REQUESTS,
    SERIES_CAP_HITS,
    insert_stats,
    stat_sample,
)

log = logging.getLogger("ttft.writer")

#: ``store_call(fn, *args)`` runs ``fn(client, *args)`` on the store thread.
StoreCall = Callable[..., Awaitable[Any]]

#: Seconds between two rounds of ``pipeline_stats`` samples (no setting fits; the health dashboard's
#: shortest interval is 15 s, so every interval gets a sample).
STATS_INTERVAL_S = 10.0


class JoinStats:
    """The latest gauges of each join worker, read from its watermark heartbeats (see join_fold).

    A worker not heard from for ``forget_after_s`` (it stopped, or its partitions moved) is dropped, so a
    dead worker's last open-request count is not summed forever.
    """

    def __init__(self, topic: str, forget_after_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.topic = topic
        self.forget_after_s = forget_after_s
        self.clock = clock
        self._workers: dict[str, tuple[float, float, float, float]] = {}  # worker -> (seen, open, evictions, cut off)
        self._lag: dict[int, tuple[float, str, float]] = {}  # source partition -> (seen, worker, lag)

    def observe(self, beat: dict[str, Any]) -> None:
        worker = beat.get("worker_id")
        if not isinstance(worker, str):
            return  # a heartbeat from a join older than this writer
        now = self.clock()
        self._workers[worker] = (
            now,
            float(beat.get("open_requests") or 0),
            float(beat.get("evictions") or 0),
            float(beat.get("otlp_cut_off_traces") or 0),
        )
        if beat.get("lag") is not None:
            self._lag[int(beat["source_partition"])] = (now, worker, float(beat["lag"]))

    def samples(self, now_ms: float) -> list[dict[str, Any]]:
        horizon = self.clock() - self.forget_after_s
        self._workers = {w: v for w, v in self._workers.items() if v[0] >= horizon}
        self._lag = {p: v for p, v in self._lag.items() if v[0] >= horizon}
        out: list[dict[str, Any]] = []
        for worker, (_, open_requests, evictions, cut_off) in sorted(self._workers.items()):
            out.append(stat_sample(now_ms, worker, "join", OPEN_REQUESTS, open_requests))
            out.append(stat_sample(now_ms, worker, "join", EVICTIONS, evictions))
            out.append(stat_sample(now_ms, worker, "join", CUT_OFF_TRACES, cut_off))
        for partition, (_, worker, lag) in sorted(self._lag.items()):
            labels = {"topic": self.topic, "partition": str(partition)}
            out.append(stat_sample(now_ms, worker, "join", CONSUMER_LAG, lag, labels))
        return out


class StatsReporter:
    """Writes one worker's metrics to ``pipeline_stats`` every ``interval_s``, best effort.

    Samples (names from :mod:`streams.store.stats_store`): ``consumer_lag`` per partition the worker owns
    now (labels ``topic``, ``partition``), ``insert_latency_ms`` per table (the mean of the inserts since
    the last written round; a table without inserts since then has no sample) and ``series_cap_hits``
    (``ttft_series_overflow``: series folded into ``__other__``, summed over the windows closed since the
    worker started). A round that fails to build or to write is logged and dropped, never retried; no
    round is tried while ``store_down()`` (the record path is retrying the store then, and a stats write
    would only queue on the store thread beside it).
    """

    def __init__(
        self,
        metrics: WorkerMetrics,
        store_call: StoreCall,
        database: str,
        *,
        owned: Callable[[], set[tuple[str, int]]],
        store_down: Callable[[], bool] = lambda: False,
        interval_s: float = STATS_INTERVAL_S,
        clock: Callable[[], float] = time.time,
        join_samples: Callable[[float], list[dict[str, Any]]] = lambda now_ms: [],
    ) -> None:
        self.metrics = metrics
        self.store_call = store_call
        self.join_samples = join_samples
        self.database = database
        self.owned = owned
        self.store_down = store_down
        self.interval_s = interval_s
        self.clock = clock
        #: insert_seconds (sum, count) per table at the last written round
        self._latency_seen: dict[str, tuple[float, float]] = {}

    def samples(self, now_ms: float) -> tuple[list[dict[str, Any]], dict[str, tuple[float, float]]]:
        """One round of samples, and the latency totals to remember once it is written."""
        m = self.metrics

        def sample(metric: str, value: float, labels: dict[str, str] | None = None) -> dict[str, Any]:
            return stat_sample(now_ms, m.worker_id, m.role, metric, value, labels)

        owned = self.owned()
        out = [
            sample(CONSUMER_LAG, s.value, {"topic": s.labels["topic"], "partition": s.labels["partition"]})
            for family in m.consumer_lag.collect()
            for s in family.samples
            if (s.labels["topic"], int(s.labels["partition"])) in owned
        ]
        totals: dict[str, tuple[float, float]] = {}
        for family in m.insert_seconds.collect():
            for s in family.samples:
                total_s, count = totals.get(s.labels["table"], (0.0, 0.0))
                if s.name.endswith("_sum"):
                    totals[s.labels["table"]] = (s.value, count)
                elif s.name.endswith("_count"):
                    totals[s.labels["table"]] = (total_s, s.value)
        for table, (total_s, count) in sorted(totals.items()):
            seen_s, seen_n = self._latency_seen.get(table, (0.0, 0.0))
            if count > seen_n:
                out.append(sample(INSERT_LATENCY_MS, 1000.0 * (total_s - seen_s) / (count - seen_n), {"table": table}))
        overflow = sum(s.value for f in m.series_overflow.collect() for s in f.samples if s.name.endswith("_total"))
        out.append(sample(SERIES_CAP_HITS, overflow))
        out += self.join_samples(now_ms)
        return out, totals

    async def write_once(self) -> bool:
        """Write one round now; ``False`` when it was skipped or failed. Never raises (but is cancellable)."""
        if self.store_down():
            return False
        try:
            samples, totals = self.samples(self.clock() * 1000.0)
            await self.store_call(insert_stats, self.database, samples)
        except Exception as exc:  # stats are best effort: whatever went wrong, the record path goes on
            log.warning("pipeline_stats not written (%s: %s); this round is dropped", type(exc).__name__, exc)
            return False
        self._latency_seen = totals
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Write a round every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
            if not stop.is_set():
                await self.write_once()
