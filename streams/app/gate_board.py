"""The writer says which gates keep rules silent (:mod:`streams.rules.gates`), where on-call looks.

At start it publishes its configuration's gates to ``ttft.rule-evaluations`` (``ttft rules status`` reads
them) and stores them in ``rule_gates`` (the pipeline-health board), ending the stored gates its
configuration no longer has. Every :data:`REFRESH_S` it reads the quarantined sources from ``ttft.alerts``
and stores those that began or ended, so the board shows a quarantine within that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.errors import KafkaError

from streams.rules.gates import GATES_KEY, Gate, config_gates, gate_rows, gates_message
from streams.settings import Settings
from streams.store.aggregates_store import insert_rows
from streams.store.client import check_identifier
from streams.views.quarantines import read_quarantines

log = logging.getLogger("ttft.alerting")

#: How often the writer reads the quarantines from ``ttft.alerts`` for the board.
REFRESH_S = 30.0
QUARANTINED = "quarantined"
QUARANTINE_RULE = "TTFTSourceQuarantined"

StoreCall = Callable[..., Awaitable[Any]]
Publish = Callable[[str, bytes, bytes], Awaitable[None]]


def active_gates(client: Any, database: str) -> list[Gate]:
    """The gates stored as active (latest row per gate, rule and scope)."""
    result = client.query(
        "SELECT gate, rule, scope, argMax(detail, updated_at), argMax(active, updated_at), "
        "toUnixTimestamp64Milli(argMax(since, updated_at)) "
        f"FROM {check_identifier(database)}.rule_gates GROUP BY gate, rule, scope"
    )
    return [
        Gate(str(g), str(r), str(s), str(d), float(since)) for g, r, s, d, active, since in result.result_rows if active
    ]


def store_gates(client: Any, database: str, started: list[Gate], ended: list[Gate], at_ms: float) -> None:
    insert_rows(client, database, "rule_gates", gate_rows(started, True, at_ms) + gate_rows(ended, False, at_ms))


class GateBoard:
    """Keeps ``rule_gates`` and the published gates in step with the writer's configuration and the join's
    quarantines (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        store_call: StoreCall,
        publish: Publish,
        worker_id: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.store_call, self.publish = settings, store_call, publish
        self.worker_id, self.clock = worker_id, clock
        self.db = settings.clickhouse_database
        #: Quarantines stored as active, by key.
        self.quarantines: dict[tuple[str, str, str], Gate] = {}

    async def start(self) -> None:
        """Publish and store this configuration's gates; end the stored ones it no longer has."""
        now = self.clock() * 1000.0
        gates = config_gates(self.settings)
        await self.publish(
            self.settings.topic("rule-evaluations"), GATES_KEY, gates_message(gates, self.worker_id, now)
        )
        stored = await self.store_call(active_gates, self.db)
        keys = {g.key for g in gates}
        ended = [g for g in stored if g.gate != QUARANTINED and g.key not in keys]
        known = {g.key: g for g in stored}
        started = [
            Gate(g.gate, g.rule, g.scope, g.detail, known[g.key].since_ms) if g.key in known else g for g in gates
        ]
        self.quarantines = {g.key: g for g in stored if g.gate == QUARANTINED}
        await self.store_call(store_gates, self.db, started, ended, now)
        for gate in gates:
            log.warning("rule gate: %s %s: %s", gate.gate, gate.rule, gate.detail)

    async def refresh(self) -> None:
        """Store the quarantines that began or ended since the last call (read from ``ttft.alerts``)."""
        found = await read_quarantines(self.settings, timeout_s=REFRESH_S)
        now = self.clock() * 1000.0
        current = {
            (QUARANTINED, QUARANTINE_RULE, q.source): Gate(
                QUARANTINED,
                QUARANTINE_RULE,
                q.source,
                "the join's dead-letter guard holds it: its invalid events are dead-lettered, not judged"
                + (f" (partitions {', '.join(q.holders)})" if q.holders else ""),
                q.since_ms,
            )
            for q in found
        }
        started = [g for key, g in current.items() if self.quarantines.get(key) != g]
        ended = [g for key, g in self.quarantines.items() if key not in current]
        if started or ended:
            await self.store_call(store_gates, self.db, started, ended, now)
            for gate in started:
                log.warning("rule gates: quarantined %s on the board", gate.scope)
            for gate in ended:
                log.warning("rule gates: quarantine of %s ended", gate.scope)
        self.quarantines = current

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every :data:`REFRESH_S` until ``stop``; a failed read is logged and tried again."""
        while not stop.is_set():
            try:
                await self.refresh()
            except (KafkaError, OSError, RuntimeError, TimeoutError) as exc:
                log.warning("rule gates: cannot read the quarantines from %s: %s", self.settings.topic("alerts"), exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REFRESH_S)
