"""``ttft top``'s Kafka side: read the three aggregate topics into a :class:`TopModel` and refresh a frame.

The consumer has no group (nothing is committed, nobody's offsets move) and is assigned every partition
of ``ttft.stage-windows``, ``ttft.window-health`` and ``ttft.alerts``. It starts at the first message
newer than ``lookback_ms`` of wall clock (``offsets_for_times``; message timestamps are publish times) or
at the beginning. "Caught up" means every partition reached the end offset it had at start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rich.console import Console
from rich.live import Live

from streams.kafka.topics import kafka_client_kwargs
from streams.settings import Settings
from streams.views.top import KINDS, TopFrame, TopModel, frame_text, render_frame


async def _partitions(settings: Settings, topics: list[str]) -> list[TopicPartition]:
    # A metadata request through the admin client: a group-less consumer's own metadata only covers the
    # topics it already knows, so partitions_for_topic() would answer None for the ones it never saw.
    admin = AIOKafkaAdminClient(**kafka_client_kwargs(settings))
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    found = {
        str(entry["topic"]): sorted(int(p["partition"]) for p in entry["partitions"])
        for entry in described
        if not entry.get("error_code") and entry.get("partitions")
    }
    missing = [t for t in topics if t not in found]
    if missing:
        raise RuntimeError(f"topic(s) {', '.join(missing)} do not exist (run the worker's topic setup first)")
    return [TopicPartition(t, p) for t in topics for p in found[t]]


class TopicFeed:
    """Group-less consumer of the aggregate topics folding into ``model``."""

    def __init__(self, settings: Settings, model: TopModel, *, start_ms: float | None) -> None:
        self.settings = settings
        self.model = model
        self.start_ms = start_ms
        self._kinds = {settings.topic(kind): kind for kind in KINDS}
        self._consumer: AIOKafkaConsumer | None = None
        self._tps: list[TopicPartition] = []
        self._end: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        """Connect, assign all partitions and seek to the start; raises if a topic does not exist."""
        self._tps = await _partitions(self.settings, list(self._kinds))
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **kafka_client_kwargs(self.settings))
        await consumer.start()
        self._consumer = consumer
        consumer.assign(self._tps)
        self._end = await consumer.end_offsets(self._tps)
        if self.start_ms is None:
            await consumer.seek_to_beginning(*self._tps)
            return
        found = await consumer.offsets_for_times({tp: int(self.start_ms) for tp in self._tps})
        for tp in self._tps:
            hit = found.get(tp)
            consumer.seek(tp, hit.offset if hit is not None else self._end[tp])

    async def poll(self, timeout_ms: int = 200) -> int:
        """Fold whatever arrives within ``timeout_ms``; returns the number of messages."""
        assert self._consumer is not None, "start() first"
        batch = await self._consumer.getmany(*self._tps, timeout_ms=timeout_ms, max_records=5_000)
        n = 0
        for tp, records in batch.items():
            kind = self._kinds[tp.topic]
            for record in records:
                self.model.fold(kind, record.value)
                n += 1
        return n

    async def caught_up(self) -> bool:
        """Whether every partition has reached its end offset as of :meth:`start`."""
        assert self._consumer is not None, "start() first"
        for tp in self._tps:
            if await self._consumer.position(tp) < self._end[tp]:
                return False
        return True

    async def catch_up(self, timeout_s: float) -> bool:
        """Poll until caught up or ``timeout_s`` passed; returns whether it caught up."""
        deadline = time.monotonic() + timeout_s
        while not await self.caught_up():
            if time.monotonic() >= deadline:
                return False
            await self.poll()
        return True

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


async def run_top(
    settings: Settings,
    *,
    console: Console,
    lookback_ms: float | None = 15 * 60_000.0,
    span_ms: int = 300_000,
    once: bool = False,
    duration_s: float | None = None,
    interval_s: float = 1.0,
    live: bool | None = None,
    clock: Callable[[], float] = time.time,
) -> TopFrame:
    """Run the dashboard; returns the last frame.

    ``once``: catch up, print one frame and return. Otherwise refresh every ``interval_s`` until
    ``duration_s`` (forever when ``None``; Ctrl-C ends it). ``live`` (default: whether ``console`` is a
    terminal) redraws in place with rich Live; without it a plain-text frame is printed whenever the
    content changed.
    """
    model = TopModel(window_ms=settings.windows.window_s * 1000, span_ms=span_ms)
    start_ms = None if lookback_ms is None else clock() * 1000.0 - lookback_ms
    feed = TopicFeed(settings, model, start_ms=start_ms)
    try:
        await feed.start()
        if once:
            await feed.catch_up(timeout_s=max(30.0, duration_s or 0.0))
            frame = model.frame(settings.slo_ms)
            _print(console, frame, live if live is not None else console.is_terminal)
            return frame
        return await _loop(
            feed,
            model,
            settings,
            console,
            duration_s,
            interval_s,
            console.is_terminal if live is None else live,
        )
    finally:
        await feed.stop()


def _print(console: Console, frame: TopFrame, rich_output: bool) -> None:
    if rich_output:
        console.print(render_frame(frame))
    else:
        console.print(frame_text(frame, width=console.width), markup=False, highlight=False, end="")


async def _loop(
    feed: TopicFeed,
    model: TopModel,
    settings: Settings,
    console: Console,
    duration_s: float | None,
    interval_s: float,
    live: bool,
) -> TopFrame:
    deadline = None if duration_s is None else time.monotonic() + duration_s
    frame = model.frame(settings.slo_ms)
    last_text: str | None = None
    display: Any = Live(render_frame(frame), console=console, auto_refresh=False) if live else None
    if display is not None:
        display.start()
    try:
        while deadline is None or time.monotonic() < deadline:
            tick_end = time.monotonic() + interval_s
            while time.monotonic() < tick_end:
                await feed.poll(timeout_ms=max(1, int(1000 * min(0.2, tick_end - time.monotonic()))))
            frame = model.frame(settings.slo_ms)
            if display is not None:
                display.update(render_frame(frame), refresh=True)
                continue
            text = frame_text(frame, width=console.width)
            if text != last_text:
                console.print(text, markup=False, highlight=False, end="")
                last_text = text
            await asyncio.sleep(0)
    finally:
        if display is not None:
            display.stop()
    return frame
