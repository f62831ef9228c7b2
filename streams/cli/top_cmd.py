"""``ttft top``: a live terminal dashboard over the aggregate topics (no database access)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io

import click
from aiokafka.errors import KafkaError
from rich.console import Console

from streams.cli.conventions import echo_json, json_option
from streams.settings import Settings, load_settings
from streams.views.span import parse_duration_ms
from streams.views.top import TopFrame
from streams.views.top_feed import run_top


def _duration_ms(text: str, name: str) -> float:
    value = parse_duration_ms(text)
    if value is None:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m or 1h", param_hint=name)
    return value


@click.command()
@click.option(
    "--lookback",
    default="15m",
    show_default=True,
    help="Start with messages published this long ago (wall clock).",
)
@click.option("--from-beginning", is_flag=True, help="Read the topics from their beginning instead.")
@click.option(
    "--span",
    "span",
    default="5m",
    show_default=True,
    help="Event time merged into each panel, ending with the newest window.",
)
@click.option("--once", is_flag=True, help="Catch up, print one frame and exit.")
@click.option("--duration", "duration_s", type=float, default=None, help="Stop after this many seconds.")
@click.option("--interval", "interval_s", type=float, default=1.0, show_default=True, help="Refresh period (s).")
@click.option("--plain", is_flag=True, help="Plain-text frames even on a terminal.")
@json_option("Catch up, print one frame as JSON (times in epoch ms) and exit (implies --once).")
def top(
    lookback: str,
    from_beginning: bool,
    span: str,
    once: bool,
    duration_s: float | None,
    interval_s: float,
    plain: bool,
    as_json: bool,
) -> None:
    """Per tenant: TTFT P95 vs SLO, stage P95 bars, biggest and tail-dominant stages, levers, alerts."""
    settings = load_settings()
    window_ms = settings.windows.window_s * 1000
    span_ms = max(window_ms, int(_duration_ms(span, "--span") // window_ms * window_ms))
    if as_json:
        frame = _one_frame(settings, None if from_beginning else _duration_ms(lookback, "--lookback"), span_ms)
        echo_json(dataclasses.asdict(frame))
        return
    console = Console()
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(
                run_top(
                    settings,
                    console=console,
                    lookback_ms=None if from_beginning else _duration_ms(lookback, "--lookback"),
                    span_ms=span_ms,
                    once=once,
                    duration_s=duration_s,
                    interval_s=interval_s,
                    live=False if plain else None,
                )
            )
        except (RuntimeError, KafkaError) as exc:
            raise click.ClickException(str(exc)) from None


def _one_frame(settings: Settings, lookback_ms: float | None, span_ms: int) -> TopFrame:
    """The frame ``--once`` would print, rendered to nowhere."""
    quiet = Console(file=io.StringIO())
    try:
        return asyncio.run(run_top(settings, console=quiet, lookback_ms=lookback_ms, span_ms=span_ms, once=True))
    except (RuntimeError, KafkaError) as exc:
        raise click.ClickException(str(exc)) from None
