"""Baseline A, the ceiling: the pre-produced topic read with aiokafka ``getmany``, each value orjson-decoded.

No group, no commits, no validation, no output: the fastest a Python consumer on this machine gets the
same bytes off the same broker. Timed from the first message received to the last one decoded; the
consumer's CPU time over the same span is reported per event (robust to a shared, busy machine). The
topic is read three times and the median read is reported.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from bench.harness import topic_partitions


async def _consume(bootstrap: str, topic: str) -> tuple[int, float, float]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        tps = await topic_partitions(admin, topic)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
        total = sum(ends.values())
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        loads = orjson.loads
        n = 0
        first: float | None = None
        cpu0 = time.process_time()
        while n < total:
            batch = await consumer.getmany(timeout_ms=1_000, max_records=20_000)
            if first is None and batch:
                first = time.perf_counter()
                cpu0 = time.process_time()
            for messages in batch.values():
                for msg in messages:
                    loads(msg.value)
                n += len(messages)
        elapsed = time.perf_counter() - (first or time.perf_counter())
        return n, elapsed, time.process_time() - cpu0
    finally:
        await consumer.stop()


def measure_raw(bootstrap: str, topic: str, rounds: int = 3) -> dict[str, Any]:
    """Events/s of baseline A over every message of ``topic``: the median of ``rounds`` full reads (on a
    shared 2-core machine one read moves by a third from noise alone; every read is in the details)."""
    reads = [asyncio.run(_consume(bootstrap, topic)) for _ in range(rounds)]
    rates = [n / elapsed if elapsed > 0 else 0.0 for n, elapsed, _ in reads]
    n, elapsed, cpu_s = sorted(reads, key=lambda r: r[0] / r[1] if r[1] > 0 else 0.0)[len(reads) // 2]
    return {
        "figures": {
            "raw_events_per_s": n / elapsed if elapsed > 0 else None,
            "raw_cpu_us_per_event": cpu_s / n * 1e6 if n else None,
            "raw_events": float(n),
        },
        "details": {"reads_events_per_s": rates},
    }
