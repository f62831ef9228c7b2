"""What the writer does after each committed batch: close windows, publish aggregates, evaluate alerts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import AIOKafkaProducer

from streams.alerting.alertmanager import AlertmanagerClient
from streams.alerting.outbox import DeliveryOptions, run_delivery_loop
from streams.alerting.supervise import supervise
from streams.app.alerting_hook import AlertingHook
from streams.app.gate_board import GateBoard
from streams.app.metrics import WorkerMetrics
from streams.app.store_outage import halt_page
from streams.app.window_closer import WindowCloser
from streams.kafka.produce import Retry, queued, settle
from streams.kafka.topics import kafka_client_kwargs
from streams.rules.links import AlertLinks, placeholder_problem
from streams.rules.model import AlertTransition
from streams.settings import Settings

log = logging.getLogger("ttft.alerting")


def alert_links(settings: Settings) -> AlertLinks:
    """Where this deployment's alerts lead; a runbook or Grafana URL that leads nowhere is logged (the
    alerts still go out: ``ttft config check`` is where such a value is refused)."""
    rules = settings.rules
    for field in ("runbook_base_url", "grafana_url"):
        problem = placeholder_problem(getattr(rules, field), f"rules.{field}")
        if problem is not None:
            log.warning("alert links: %s", problem)
    if not (rules.runbook_base_url or "").strip():
        log.warning(
            "alert links: rules.runbook_base_url is not set: each alert's runbook_url names docs/runbook.md#<alert> "
            "instead of a link (set TTFT_RULES__RUNBOOK_BASE_URL to where this deployment serves the runbook)"
        )
    return AlertLinks(rules.grafana_url, rules.runbook_base_url, settings.windows.window_s * 1000.0)


#: An aggregate row: topic, key, value.
Row = tuple[str, bytes, bytes]


class TopicPublisher:
    """Produces aggregate rows; ``flush`` waits until the broker acknowledged them (a broker outage delays a
    flush instead of failing it, as for the runner's producer)."""

    def __init__(self, settings: Settings, refused: Any = None) -> None:
        #: Counts the rows the broker refused with a retriable error (``ttft_produce_refused_total``).
        self.refused = refused
        self.producer = AIOKafkaProducer(
            linger_ms=10, max_batch_size=1_048_576, acks="all", **kafka_client_kwargs(settings)
        )
        self._pending: list[tuple[Row, asyncio.Future[Any]]] = []

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.flush()
        await self.producer.stop()

    async def publish(self, topic: str, key: bytes, value: bytes) -> None:
        # Queued first, then listed: a flush that began while this send waited must not miss its row (the
        # list to append to is read after the await, never before it).
        row = (topic, key, value)
        future = await queued(self._send, row)
        self._pending.append((row, future))
        # Done at once only when refused before it was queued (no metadata for the topic within the request
        # timeout: the broker is away): the flush sends it again until the broker is back.
        if future.done() or len(self._pending) >= 5_000:
            await self.flush()

    async def _send(self, row: Row) -> asyncio.Future[Any]:
        topic, key, value = row
        future: asyncio.Future[Any] = await self.producer.send(topic, value=value, key=key)
        return future

    async def flush(self) -> None:
        """Wait for every row published so far; a row the broker refused with a retriable error (an outage
        past the request timeout) is sent again until it is taken (:mod:`streams.kafka.produce`)."""
        retry = Retry("aggregate row(s)", counter=self.refused)
        while self._pending:
            sent, self._pending = self._pending, []
            await settle(sent, self._send, retry)


async def resume(settings: Settings, closer: WindowCloser, alerting: AlertingHook) -> None:
    """Start-up: a live writer resumes where it stopped (stale windows recomputed, the rule engine rebuilt
    from the stored windows). A replay's writer does not: the windows it re-closes are already stored, so
    recovery would mark them closed and their records would count as amendments, which are stored but
    never evaluated. Started empty, it evaluates each window once, in event-time order."""
    if settings.replay:
        return
    await closer.recover()
    await alerting.rebuild(closer)


async def _show_gates(writer: Any, settings: Settings, metrics: WorkerMetrics, publisher: TopicPublisher) -> None:
    """Publish and store the gates that keep rules silent, and keep the quarantines on the board
    (:mod:`streams.app.gate_board`); a replay's writer leaves them to the live one."""
    if settings.replay:
        return
    board = GateBoard(settings, writer.store_call, publisher.publish, metrics.worker_id)
    await board.start()
    await publisher.flush()
    stop = asyncio.Event()
    task = asyncio.create_task(board.run(stop))

    async def stop_board() -> None:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)

    writer.on_stop.append(stop_board)


async def install_hooks(writer: Any, settings: Settings, metrics: WorkerMetrics) -> WindowCloser:
    """Attach the window closer, the rule engine and (with an Alertmanager URL) the delivery loop."""
    publisher = TopicPublisher(settings, refused=metrics.produce_refused.labels("row"))
    await publisher.start()
    closer = WindowCloser(settings, metrics, writer.store_call, publisher.publish, background=True)
    alerting = AlertingHook(
        settings, metrics, writer.store_call, publisher.publish, publisher.flush, muted=settings.paging_muted
    )
    await resume(settings, closer, alerting)
    alerting.attach(closer)
    publish_page = halt_page(settings, publisher.publish)

    async def page(state: str, detail: str) -> None:
        await publish_page(state, detail)
        await publisher.flush()

    writer.halt_page = page
    await _show_gates(writer, settings, metrics, publisher)
    # At stop the queued closes run first: they publish alerts, which the delivery loop then still sends.
    writer.on_stop.append(closer.stop)

    async def became_owner() -> None:  # another writer closed windows until now: start from the store
        await resume(settings, closer, alerting)

    closer.ownership_hooks.append(became_owner)
    if settings.alertmanager_url:
        stop = asyncio.Event()
        client = AlertmanagerClient(settings.alertmanager_url.get_secret_value())
        options = DeliveryOptions(paging_muted=settings.paging_muted, links=alert_links(settings))

        def refused(transition: AlertTransition, why: str) -> None:  # on /metrics and /healthz, for on-call
            metrics.alerts_refused.labels(transition.labels.get("alertname", "")).inc()
            metrics.health["alerts_refused"] = metrics.health.get("alerts_refused", 0) + 1
            metrics.health["last_alert_refused"] = f"{transition.labels.get('alertname', '')}: {why}"[:300]

        def deliver() -> Any:
            return run_delivery_loop(
                settings,
                client,
                stop,
                options=options,
                on_pending=metrics.alerts_pending_delivery.set,
                on_refused=refused,
            )

        def restarted(reason: str) -> None:
            metrics.alert_delivery_restarts.labels(reason).inc()
            metrics.health["alert_delivery_restarts"] = metrics.health.get("alert_delivery_restarts", 0) + 1

        task = asyncio.create_task(supervise("alert delivery", deliver, stop, on_restart=restarted))

        async def stop_delivery() -> None:
            stop.set()
            await asyncio.wait_for(task, timeout=30)

        writer.on_stop.append(stop_delivery)

    async def on_batch(records: list[dict[str, Any]]) -> None:
        for source, target, watermark_ms in writer.heartbeats:
            closer.source_watermarks.observe(source, target, watermark_ms)
        writer.heartbeats.clear()
        closer.request_partitions = writer.request_partitions()
        closer.all_partitions = writer.all_request_partitions()
        vacated, writer.vacated = writer.vacated, set()
        await closer.on_records(
            records,
            polled_s=writer.last_poll_s,
            answered=writer.last_poll_answered,
            serialised=writer.batch_values,
            vacated=vacated,
        )
        await publisher.flush()

    writer.hooks.append(on_batch)
    writer.on_stop.append(publisher.stop)
    return closer
