"""What the writer does after each committed batch: close windows, publish aggregates, evaluate alerts."""

from __future__ import annotations

from typing import Any

from streams.app.metrics import WorkerMetrics
from streams.settings import Settings


async def install_hooks(writer: Any, settings: Settings, metrics: WorkerMetrics) -> None:
    """Attach the window closer (and through it the rule engine) to a started writer."""
    return None
