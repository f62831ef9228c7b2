"""The folds run as Faust agents over channels of steps: the agent's body is the fold, a step is resolved
once the fold returned, and a fold's error goes to the step's waiter (the runner) instead of escaping the
agent, where Faust would ack and lose it. The agent keeps serving the next step."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from streams.app.agents import create_role_app, fold_agent
from streams.kafka.batches import Emit, Step
from streams.settings import load_settings


class RecordingFold:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def fold(self, records: Any, now_ms: float, view: Any, emit: Emit) -> None:
        if records == "boom":
            raise RuntimeError("a bug in the fold")
        self.seen.append(records)
        emit("out", b"k", b"v", 0)


def test_steps_go_through_the_agent_in_order_and_errors_reach_the_runner(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path)
    app = create_role_app(settings, "unit", "w1")
    fold = RecordingFold()
    submit = fold_agent(app, "unit-fold", fold)

    async def run() -> list[Any]:
        await app.start()
        app.flow_control.resume()
        try:
            outputs: list[Any] = []
            for records in ({"a": 1}, "boom", {"b": 2}):
                out: dict[Any, Any] = defaultdict(list)
                step = Step(records, 0.0, None, Emit(out, {"out": [0]}, {}))  # type: ignore[arg-type]
                await submit(step)
                try:
                    await asyncio.wait_for(step.done, 10)
                    outputs.append(dict(out))
                except RuntimeError as exc:
                    outputs.append(str(exc))
            return outputs
        finally:
            await app.stop()

    outputs = asyncio.run(run())
    assert fold.seen == [{"a": 1}, {"b": 2}]
    assert outputs == [{("out", 0): [(b"k", b"v")]}, "a bug in the fold", {("out", 0): [(b"k", b"v")]}]


def test_the_role_app_starts_neither_fausts_consumer_nor_its_producer(tmp_path: Path) -> None:
    app = create_role_app(load_settings(home=tmp_path), "unit", "w2")
    strategy = app.boot_strategy
    assert list(strategy.kafka_consumer()) == [] and list(strategy.kafka_producer()) == []
    assert list(strategy.tables()) == [] and list(strategy.web_server()) == []


@pytest.fixture(autouse=True)
def _fresh_loop() -> None:
    asyncio.set_event_loop(asyncio.new_event_loop())
