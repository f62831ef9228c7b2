"""``ttft replay``: re-process stage-event history into the same tables, with paging muted."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time

import click

from streams.app.replay import plan_replay, run_replay
from streams.settings import load_settings


def _parse_time(text: str) -> int:
    if text.isdigit():
        return int(text)
    parsed = dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


@click.command("replay")
@click.option("--from-time", "from_time", default=None, help="ISO 8601 (UTC if naive) or epoch ms.")
@click.option("--from-offset", "from_offset", type=int, default=None, help="The same offset on every partition.")
@click.option("--join-only", is_flag=True, help="Re-emit records only; the running writer stores them.")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True)
def replay(from_time: str | None, from_offset: int | None, join_only: bool, timeout_s: float) -> None:
    """Re-process ttft.stage-events from a time or offset into the same tables (idempotent, paging muted).

    With the embedded store, stop the running writer first, or pass --join-only.
    """
    if (from_time is None) == (from_offset is None):
        raise click.UsageError("give exactly one of --from-time or --from-offset")
    settings = load_settings()
    app_id = f"{settings.app_id}-replay-{int(time.time())}"
    plan = asyncio.run(
        plan_replay(
            settings,
            from_time_ms=_parse_time(from_time) if from_time else None,
            from_offset=from_offset,
            app_id=app_id,
        )
    )
    click.echo(f"replay {app_id}: {plan.events} events on {len(plan.start)} partitions (paging muted)")
    sys.exit(run_replay(settings, plan, join_only=join_only, timeout_s=timeout_s, progress=click.echo))
