from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer
from click.testing import CliRunner

from streams.cli.main import main
from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings
from streams.sim import ErrorRates, generate

pytestmark = pytest.mark.kafka

START = 1_767_225_600_000.0


async def _consume(settings: Settings, expected: int, timeout_s: float) -> dict[int, list[tuple[bytes, bytes, int]]]:
    consumer = AIOKafkaConsumer(
        settings.topic("stage-events"),
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **kafka_client_kwargs(settings),
    )
    await consumer.start()
    by_partition: dict[int, list[tuple[bytes, bytes, int]]] = {}
    count = 0
    try:
        deadline = time.monotonic() + timeout_s
        while count < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for tp, records in batch.items():
                for record in records:
                    assert record.key is not None and record.value is not None
                    by_partition.setdefault(tp.partition, []).append((record.key, record.value, record.timestamp))
                    count += 1
    finally:
        await consumer.stop()
    return by_partition


def _env(settings: Settings) -> dict[str, str]:
    return {"TTFT_KAFKA_BOOTSTRAP": settings.kafka_bootstrap, "TTFT_TOPIC_PREFIX": settings.topic_prefix}


def test_simulate_produces_every_event_keyed_and_timestamped(kafka_settings: Settings) -> None:
    args = [
        "simulate",
        "--scenario",
        "canary-regression",
        "--rate",
        "60",
        "--duration",
        "30",
        "--seed",
        "3",
        "--start",
        str(START),
        "--as-fast-as-possible",
        "--errors",
        "dup=0.02,malformed=0.01",
    ]
    result = CliRunner().invoke(main, args, env=_env(kafka_settings))
    assert result.exit_code == 0, result.output
    assert "events/s" in result.output
    expected = list(
        generate(
            "canary-regression",
            rate_rps=60,
            duration_s=30,
            seed=3,
            start_ms=START,
            errors=ErrorRates(duplicate=0.02, malformed=0.01),
        )
    )
    by_partition = asyncio.run(_consume(kafka_settings, len(expected), timeout_s=60))
    received = [m for records in by_partition.values() for m in records]
    assert Counter(received) == Counter((k, v, int(ts)) for k, v, ts in expected)
    assert len(by_partition) > 1
    for records in by_partition.values():
        # one request's events share a partition and keep their emission order in it
        assert [r[2] for r in records] == sorted(r[2] for r in records)


def test_simulate_paces_event_time_with_speedup(kafka_settings: Settings) -> None:
    started = time.monotonic()
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--scenario",
            "steady",
            "--rate",
            "40",
            "--duration",
            "6",
            "--speedup",
            "3",
            "--seed",
            "1",
        ],
        env=_env(kafka_settings),
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert "speedup x3" in result.output
    # 6 s of event time at x3 is ~2 s of sending, plus producer start-up and the in-flight tail
    assert 1.5 <= elapsed <= 12.0
    expected = sum(1 for _ in generate("steady", rate_rps=40, duration_s=6, seed=1, start_ms=START))
    by_partition = asyncio.run(_consume(kafka_settings, expected, timeout_s=30))
    assert sum(len(r) for r in by_partition.values()) == pytest.approx(expected, rel=0.15)
