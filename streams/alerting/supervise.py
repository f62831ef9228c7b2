"""Supervision of long-running background tasks (the Alertmanager delivery loop).

A background task that dies must never stop paging silently. :func:`supervise` runs the task again
after any crash (or an unexpected return), with capped exponential back-off, until ``stop`` is set;
each restart is logged with its traceback and reported through ``on_restart`` (a counter). The
delivery loop is safe to restart: it rebuilds its state from the ``ttft.alerts`` outbox, and
Alertmanager deduplicates a re-sent alert by its labels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("ttft.supervise")


async def supervise(
    name: str,
    run: Callable[[], Awaitable[Any]],
    stop: asyncio.Event,
    *,
    on_restart: Callable[[str], None] | None = None,
    backoff_initial_s: float = 1.0,
    backoff_max_s: float = 30.0,
) -> int:
    """Run ``run()`` until ``stop`` is set, restarting it after a crash; returns the number of restarts.

    ``on_restart(reason)`` is called once per restart (``reason``: the exception's type name, or
    ``"returned"``). Cancellation propagates (the caller stops the supervisor that way too).
    """
    restarts = 0
    delay = backoff_initial_s
    while not stop.is_set():
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a dead task is the one thing we must not allow
            reason = type(exc).__name__
            log.exception("%s died (%s); restarting in %.1f s", name, reason, delay)
        else:
            if stop.is_set():
                break
            reason = "returned"
            log.error("%s returned before it was stopped; restarting in %.1f s", name, delay)
        restarts += 1
        if on_restart is not None:
            on_restart(reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
        delay = min(delay * 2.0, backoff_max_s)
    return restarts
