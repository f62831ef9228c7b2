"""The one global halt left: the store refusing every call, paged as ``TTFTIngestHalted``.

The writer retries an infrastructure error (the store down, full, unreachable) for as long as it takes,
committing nothing meanwhile (:mod:`streams.app.writer`): ingestion is halted for every tenant, and nothing
is lost. :class:`StoreOutage` tells when that has lasted ``caps.store_halt_page_s``: the writer then pages
``TTFTIngestHalted`` once, through ``ttft.alerts`` (Kafka, not the store), and resolves it at the next call
the store accepts. A restart does not help (it resumes from the same offsets against the same store).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streams.alerting.outbox import alert_message
from streams.rules import ingest_halted_transition
from streams.settings import Settings

log = logging.getLogger("ttft.writer")

#: ``page(state, detail)``: produce the TTFTIngestHalted transition (``firing`` or ``resolved``).
HaltPage = Callable[[str, str], Awaitable[None]]


@dataclass(slots=True)
class StoreOutage:
    """How long the store has refused every call (``clock``: monotonic seconds)."""

    limit_s: float
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    paged: bool = False

    def failed(self) -> bool:
        """A call failed; True exactly once, when the outage has just lasted ``limit_s``."""
        now = self.clock()
        if self.started is None:
            self.started = now
        if not self.paged and now - self.started >= self.limit_s:
            self.paged = True
            return True
        return False

    def succeeded(self) -> bool:
        """A call succeeded; True when a page went out for the outage that just ended (resolve it)."""
        paged = self.paged
        self.started, self.paged = None, False
        return paged

    @property
    def seconds(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started


def halt_page(settings: Settings, publish: Callable[[str, bytes, bytes], Awaitable[None]]) -> HaltPage:
    """The writer's TTFTIngestHalted page: logged, then produced to ``ttft.alerts`` with ``publish``."""
    fired: list[float] = []

    async def page(state: str, detail: str) -> None:
        now_ms = time.time() * 1000.0
        if state == "firing":
            log.critical("TTFTIngestHalted: %s", detail)
            fired[:] = [now_ms]
            transition = ingest_halted_transition(
                "firing", now_ms, detail=detail, runbook_base_url=settings.rules.runbook_base_url
            )
        else:
            log.warning("ingestion resumed: the store accepts inserts again")
            transition = ingest_halted_transition(
                "resolved",
                now_ms,
                fired_at_ms=fired[0] if fired else None,
                detail="the store accepts inserts again",
                runbook_base_url=settings.rules.runbook_base_url,
            )
        key, value = alert_message(transition)
        await publish(settings.topic("alerts"), key, value)

    return page
