from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
import pytest
from aiokafka.partitioner import DefaultPartitioner
from click.testing import CliRunner

from streams.cli.main import main
from streams.cli.simulate_cmd import parse_duration_s, parse_start_ms
from streams.sim import generate
from streams.sim.produce import Pacer, produce_messages

START = 1_767_225_600_000.0


def test_simulate_writes_the_same_events_as_generate(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--scenario",
            "canary-regression",
            "--rate",
            "20",
            "--duration",
            "10s",
            "--seed",
            "4",
            "--start",
            "2026-01-01T00:00:00Z",
            "--tenants",
            "a,知识库",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    expected = generate(
        "canary-regression", rate_rps=20, duration_s=10, tenants=["a", "知识库"], seed=4, start_ms=START
    )
    assert out.read_bytes().splitlines() == [value for _, value, _ in expected]


def test_simulate_rejects_bad_options() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["simulate", "--errors", "lost=1", "--out", "-"]).exit_code == 2
    assert runner.invoke(main, ["simulate", "--duration", "-3", "--out", "-"]).exit_code == 2
    assert runner.invoke(main, ["simulate", "--scenario", "nope", "--out", "-"]).exit_code == 2
    assert runner.invoke(main, ["simulate", "--rate", "0", "--out", "-"]).exit_code == 2


def test_parse_duration_and_start() -> None:
    assert parse_duration_s("90") == 90.0
    assert parse_duration_s("10m") == 600.0
    assert parse_duration_s("1.5h") == 5400.0
    assert parse_duration_s("500ms") == 0.5
    with pytest.raises(click.BadParameter):
        parse_duration_s("ten")
    assert parse_start_ms(None, 123.0) == 123.0
    assert parse_start_ms("1767225600000", 0.0) == START
    assert parse_start_ms("2026-01-01T00:00:00Z", 0.0) == START
    assert parse_start_ms("2026-01-01T00:00:00", 0.0) == START
    assert parse_start_ms("2026-01-01T01:00:00+01:00", 0.0) == START
    with pytest.raises(click.BadParameter):
        parse_start_ms("yesterday", 0.0)


def test_pacer_maps_event_time_to_wall_time() -> None:
    now = [100.0]
    pacer = Pacer(START, speedup=10.0, clock=lambda: now[0])
    assert pacer.delay_s(START) == 0.0
    assert pacer.delay_s(START + 10_000) == pytest.approx(1.0)
    now[0] = 100.5
    assert pacer.delay_s(START + 10_000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        Pacer(START, speedup=0)


class _FakeBatch:
    def __init__(self, capacity: int) -> None:
        self.records: list[tuple[bytes, bytes, int]] = []
        self.capacity = capacity
        self.closed = False

    def append(self, *, key: bytes, value: bytes, timestamp: int) -> object | None:
        if self.closed or len(self.records) >= self.capacity:
            return None
        self.records.append((key, value, timestamp))
        return object()

    def record_count(self) -> int:
        return len(self.records)

    def close(self) -> None:
        self.closed = True


class _FakeProducer:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.sent: dict[int, list[tuple[bytes, bytes, int]]] = {}
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2, 3, 4, 5, 6, 7}

    def create_batch(self) -> _FakeBatch:
        return _FakeBatch(capacity=50)

    async def send_batch(self, batch: _FakeBatch, topic: str, *, partition: int) -> asyncio.Future[None]:
        assert batch.closed
        self.sent.setdefault(partition, []).extend(batch.records)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def test_produce_partitions_like_the_java_client_and_keeps_order_per_partition() -> None:
    messages = list(generate("steady", rate_rps=20, duration_s=20, seed=1, start_ms=START))
    made: list[_FakeProducer] = []

    def factory(**kwargs: Any) -> _FakeProducer:
        made.append(_FakeProducer(**kwargs))
        return made[-1]

    progress: list[int] = []
    report = asyncio.run(
        produce_messages(
            messages,
            topic="t",
            client_kwargs={"bootstrap_servers": "x"},
            producer_factory=factory,
            on_progress=lambda sent, ts: progress.append(sent),
            progress_every=100,
        )
    )
    producer = made[0]
    assert producer.stopped and producer.kwargs["bootstrap_servers"] == "x"
    assert report.messages == len(messages) == progress[-1]
    partitions = sorted(producer.sent)
    for part, records in producer.sent.items():
        expected = [
            (k, v, int(ts)) for k, v, ts in messages if DefaultPartitioner()(k, list(range(8)), list(range(8))) == part
        ]
        assert records == expected
    assert sum(len(r) for r in producer.sent.values()) == len(messages) and len(partitions) > 1
