"""``python -m tests.support.writers_run N``: N store writers in this one process, over one store.

Each writer is a full :class:`streams.app.writer.StoreWriter` with its own consumer (one group, so the
``ttft.requests`` partitions are split between them) and its own hooks (window closer, rule engine); they
share nothing but the store directory (chDB allows one process per store, so the writers that would be
separate pods on a ClickHouse server are separate objects here). Settings come from ``TTFT_*``.

All writers join the group before any consumes. The run ends when the group has committed the whole
topic and no writer has an open window or a queued close; it prints one JSON line: the stored windows,
alert transitions and, per writer, the windows its rule engine evaluated and the partitions it owned.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import WindowCloser
from streams.app.writer import StoreWriter
from streams.app.writer_hooks import install_hooks
from streams.settings import load_settings
from tests.support.dump_store import _plain
from tests.support.faults import ALERT_COLUMNS
from tests.support.pipeline import group_lag


async def run(count: int, timeout_s: float = 240.0) -> dict[str, Any]:
    settings = load_settings()
    writers: list[tuple[StoreWriter, WindowCloser, Any]] = []
    for i in range(count):
        metrics = WorkerMetrics("writer", f"writer-{i}")
        writer = StoreWriter(settings, metrics, stats_interval_s=None)
        await writer.start()
        closer = await install_hooks(writer, settings, metrics)
        alerting = next(h.__self__ for h in closer.hooks if hasattr(h, "__self__"))
        writers.append((writer, closer, alerting))
    everything = set(range(settings.partitions))
    deadline = time.monotonic() + 60
    while {p for w, _, _ in writers for p in w.request_partitions()} != everything or any(
        not w.request_partitions() for w, _, _ in writers
    ):
        if time.monotonic() > deadline:
            raise TimeoutError("the writers never split the partitions")
        await asyncio.sleep(0.2)
    owned = [w.request_partitions() for w, _, _ in writers]
    tasks = [asyncio.create_task(w.run()) for w, _, _ in writers]
    group = f"{settings.app_id}-writer"
    topics = [settings.topic("requests"), settings.topic("dead-letter")]
    deadline = time.monotonic() + timeout_s
    while True:
        await asyncio.sleep(1.0)
        for task in tasks:
            if task.done():
                task.result()  # a writer that died: raise its error
        lag = await asyncio.to_thread(group_lag, settings.kafka_bootstrap, group, topics)
        settled = all(not c.open and c.pending_jobs() == 0 for _, c, _ in writers)
        if lag == 0 and settled and any(c.closed for _, c, _ in writers):
            await asyncio.sleep(2.0)  # a last close or reconciliation in flight
            if all(not c.open for _, c, _ in writers):
                break
        if time.monotonic() > deadline:
            raise TimeoutError(f"not settled: lag {lag}, open {[sorted(c.open) for _, c, _ in writers]}")
    for _, closer, _ in writers:
        await closer.drain()
    client = writers[0][0].client
    db = settings.clickhouse_database

    def rows(sql: str) -> list[dict[str, Any]]:
        result = client.query(sql.replace("{db}", db))
        return [{k: _plain(v) for k, v in row.items()} for row in result.named_results()]

    out = {
        "owned": owned,
        "evaluated": [sorted(a.evaluated) for _, _, a in writers],
        "stage_windows": rows(
            "SELECT * EXCEPT (computed_version) FROM {db}.stage_windows FINAL "
            "ORDER BY window_start, tenant_id, version_id, stage"
        ),
        "window_health": rows(
            "SELECT window_start, tenant_id, version_id, total FROM {db}.window_health FINAL "
            "ORDER BY window_start, tenant_id, version_id"
        ),
        "alerts": rows(f"SELECT {ALERT_COLUMNS} FROM {{db}}.alerts FINAL ORDER BY fingerprint, state, event_at"),
        "requests": rows("SELECT count() AS n FROM {db}.requests FINAL")[0]["n"],
    }
    for writer, _, _ in writers:
        await writer.stop()
    await asyncio.gather(*tasks)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(int(sys.argv[1]))), default=str))
