"""Faust is the runtime of every ``ttft worker`` role; the join, the OTLP mapping and the writer are its agents.

Each role is a ``faust.App`` run by ``faust.Worker`` (signals, graceful stop, crash handling, logging,
timers). A role's folds are **Faust agents over channels of batches**: the partition-batch runner
(:mod:`streams.kafka.batches`) puts each fetch on the agent's ``app.channel()`` as a :class:`Step`, the
agent's body folds it, and the runner produces its outputs, writes the state and commits the offsets only
after the agent finished it and the outputs were acknowledged.

Faust's own Kafka consumer is not used for these inputs (its boot strategy starts neither its consumer
nor its producer): it cost ~85 % of the join's CPU per event, and its ``getmany`` dropped fetched records on
rebalance (``docs/scaling.md``). So the app's flow control, which Faust's consumer would resume once
partitions are assigned, is resumed here when the role starts. Nothing escapes an agent's body: a fold's
error goes to the step's waiter, the runner, which exits uncommitted (an exception escaping an agent
would ack and lose its message in Faust).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.app.base import BootStrategy
from mode import Service

from streams.kafka.batches import BatchFold, Step, Submit, exit_uncommitted, fold_step
from streams.kafka.topics import faust_broker_kwargs
from streams.settings import Settings

log = logging.getLogger("ttft.worker")

#: A stopping role that has not finished by then abandons its step in flight (uncommitted, so replayed).
STOP_DEADLINE_S = 15.0


def create_role_app(settings: Settings, role: str, worker_id: str) -> faust.App:
    """A Faust app for one role: agents, timers and lifecycle; no Faust Kafka consumer, producer or tables."""
    datadir = settings.home / "workers" / f"{role}-{worker_id}"
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        f"{settings.app_id}-{role}-runtime",
        autodiscover=False,
        datadir=str(datadir),
        web_enabled=False,
        **faust_broker_kwargs(settings),
    )
    app.boot_strategy = BootStrategy(app, enable_kafka=False, enable_web=False, enable_sensors=False)
    return app


def fold_agent(app: faust.App, name: str, fold: BatchFold) -> Submit:
    """Register ``fold`` as the agent ``name`` over a channel of steps; return how the runner submits a step."""
    channel = app.channel()

    async def agent(steps: Any) -> None:
        async for step in steps:
            await fold_step(fold, step)

    app.agent(channel, name=name, concurrency=1)(agent)

    async def submit(step: Step) -> None:
        await channel.put(step)  # type: ignore[arg-type]  # a plain value: no Faust message to ack

    return submit


@dataclass
class RoleParts:
    """What a role's service starts, runs and stops (coroutines of the role's own objects)."""

    start: Callable[[], Awaitable[None]]
    run: Callable[[], Awaitable[None]]
    stop: Callable[[], None]
    #: Leave the groups when a stop abandoned the step in flight.
    close: Callable[[], Awaitable[None]]
    #: After the role ended either way (the metrics server, the run file).
    cleanup: Callable[[], Awaitable[None]] = field(default=lambda: _nothing())
    #: Once started: more for the role's run file (the writer: its store and the store's HTTP interface).
    run_info: Callable[[], dict[str, Any]] = field(default=dict)


async def _nothing() -> None:
    return None


class RoleService(Service):  # type: ignore[misc]
    """Starts a role once the app's agents run, runs it, and stops it in bounded time."""

    def __init__(self, app: faust.App, name: str, parts: RoleParts, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app
        self.role_name = name
        self.parts = parts
        self._task: asyncio.Future[None] | None = None

    async def on_start(self) -> None:
        self.app.flow_control.resume()  # Faust's consumer would do this on assignment; it is not started
        await self.parts.start()
        self._task = asyncio.ensure_future(self.parts.run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Future[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        try:
            raise task.exception()  # type: ignore[misc]
        except Exception:
            exit_uncommitted(f"{self.role_name} stopped on an error")

    async def on_stop(self) -> None:
        self.parts.stop()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_DEADLINE_S)
            except TimeoutError:
                log.warning("%s: stop deadline passed; the step in flight was not committed", self.role_name)
                task.cancel()
                await self.parts.close()
        await self.parts.cleanup()
