"""``ttft simulate``: produce a scenario's stage events to ``ttft.stage-events`` (or write JSON lines)."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import IO, Any

import click

from streams.cli.conventions import echo_json, json_option
from streams.sim.faults import ErrorRates
from streams.sim.scenarios import DEFAULT_TENANTS, SCENARIOS
from streams.sim.traffic import Message, generate

_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_PLAIN_EVERY_S = 5.0


def parse_duration_s(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"1.5h"``, ``"500ms"`` -> seconds."""
    match = _DURATION_RE.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{text!r} is not a positive duration like 90, 90s, 10m or 1h")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_start_ms(text: str | None, now_ms: float) -> float:
    """Event-time start: epoch milliseconds, an ISO 8601 instant (naive means UTC), or now."""
    if text is None or text == "now":
        return now_ms
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither epoch milliseconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp() * 1000.0


def _parse_tenants(text: str | None) -> list[str]:
    if not text:
        return list(DEFAULT_TENANTS)
    tenants = [t.strip() for t in text.split(",") if t.strip()]
    if not tenants:
        raise click.BadParameter("give at least one tenant")
    return tenants


class _Progress:
    """Progress over event time: a rich bar on a terminal, a plain line every few seconds otherwise."""

    def __init__(self, start_ms: float, duration_s: float, live: bool, to_stderr: bool = False) -> None:
        self.start_ms = start_ms
        self.total_s = duration_s
        self.live = live
        self.to_stderr = to_stderr
        self._last_line = time.monotonic()
        self._started = time.monotonic()
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(
                TextColumn("[bold]simulate[/]"),
                BarColumn(),
                TextColumn("{task.completed:>7.0f}/{task.total:.0f} s event time"),
                TextColumn("{task.fields[sent]:>10,} events  {task.fields[rate]:>8,.0f} ev/s"),
                TimeElapsedColumn(),
            )
            self._rich.__enter__()
            self._task = self._rich.add_task("simulate", total=self.total_s, sent=0, rate=0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def update(self, sent: int, event_ms: float) -> None:
        done_s = min(self.total_s, max(0.0, (event_ms - self.start_ms) / 1000.0))
        now = time.monotonic()
        rate = sent / max(now - self._started, 1e-9)
        if self._rich is not None:
            self._rich.update(self._task, completed=done_s, sent=sent, rate=rate)
        elif now - self._last_line >= _PLAIN_EVERY_S:
            self._last_line = now
            click.echo(
                f"simulate: {sent} events, {done_s:.0f}/{self.total_s:.0f} s event time, {rate:,.0f} ev/s",
                err=self.to_stderr,
            )


def _write_lines(messages: Iterator[Message], out: IO[bytes], progress: Callable[[int, float], None]) -> int:
    sent = 0
    last_ts = 0.0
    for _, value, ts in messages:
        out.write(value)
        out.write(b"\n")
        sent += 1
        last_ts = ts
        if sent % 5_000 == 0:
            progress(sent, last_ts)
    progress(sent, last_ts)
    return sent


@click.command("simulate")
@click.option("--scenario", type=click.Choice(SCENARIOS), default="steady", show_default=True)
@click.option("--rate", type=float, default=50.0, show_default=True, help="Requests per second of event time.")
@click.option("--duration", default="60", show_default=True, help="Event-time length: 90, 90s, 10m, 1h.")
@click.option("--tenants", default=None, help=f"Comma-separated tenant ids [default: {','.join(DEFAULT_TENANTS)}].")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed and start: same events.")
@click.option("--start", default=None, help="Event-time start: ISO 8601 or epoch ms [default: now].")
@click.option(
    "--speedup",
    type=float,
    default=1.0,
    show_default=True,
    help="Event time runs this many times faster than wall time while producing.",
)
@click.option("--as-fast-as-possible", "unpaced", is_flag=True, help="No pacing: send as fast as Kafka takes it.")
@click.option(
    "--errors",
    "errors_text",
    default=None,
    help="Fault injection, e.g. dup=0.01,missing=0.01,orphan=0.01,malformed=0.005.",
)
@click.option("--bootstrap", default=None, help="Kafka bootstrap servers [default: TTFT_KAFKA_BOOTSTRAP].")
@click.option(
    "--out",
    type=click.File("wb"),
    default=None,
    help="Write JSON lines here ('-' = stdout) instead of producing to Kafka.",
)
@json_option("Print what was produced or written as JSON (progress goes to stderr); not with --out -.")
def simulate(
    scenario: str,
    rate: float,
    duration: str,
    tenants: str | None,
    seed: int,
    start: str | None,
    speedup: float,
    unpaced: bool,
    errors_text: str | None,
    bootstrap: str | None,
    out: IO[bytes] | None,
    as_json: bool,
) -> None:
    """Produce simulated stage events of a scenario to the stage-events topic, keyed by request_id."""
    to_stdout = out is not None and getattr(out, "name", "<stdout>") == "<stdout>"
    if as_json and to_stdout:
        raise click.UsageError("--json prints on stdout: give --out a file, not '-'")
    if rate <= 0:
        raise click.BadParameter("must be positive", param_hint="--rate")
    if speedup <= 0:
        raise click.BadParameter("must be positive", param_hint="--speedup")
    duration_s = parse_duration_s(duration)
    start_ms = parse_start_ms(start, time.time() * 1000.0)
    try:
        errors = ErrorRates.parse(errors_text) if errors_text else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--errors") from exc
    messages = generate(
        scenario,
        rate_rps=rate,
        duration_s=duration_s,
        tenants=_parse_tenants(tenants),
        seed=seed,
        start_ms=start_ms,
        errors=errors,
    )
    live = out is None and sys.stdout.isatty() and not as_json
    started = time.perf_counter()
    if out is not None:
        progress = _Progress(start_ms, duration_s, live=False, to_stderr=as_json)
        sent = _write_lines(messages, out, progress.update if not to_stdout else lambda *_: None)
        elapsed = time.perf_counter() - started
        if as_json:
            echo_json(
                {"scenario": scenario, "out": out.name, "events": sent, "seconds": round(elapsed, 3), "seed": seed}
            )
            return
        click.echo(f"wrote {sent} events in {elapsed:.1f} s ({sent / max(elapsed, 1e-9):,.0f} events/s)", err=True)
        return
    _produce(messages, scenario, start_ms, duration_s, None if unpaced else speedup, bootstrap, live, as_json)


def _produce(
    messages: Iterator[Message],
    scenario: str,
    start_ms: float,
    duration_s: float,
    speedup: float | None,
    bootstrap: str | None,
    live: bool,
    as_json: bool = False,
) -> None:
    from streams.kafka.topics import kafka_client_kwargs
    from streams.settings import load_settings
    from streams.sim.produce import Pacer, produce_messages

    settings = load_settings(**({"kafka_bootstrap": bootstrap} if bootstrap else {}))
    topic = settings.topic("stage-events")
    pacer = Pacer(start_ms, speedup) if speedup is not None else None
    pacing = "as fast as possible" if speedup is None else f"speedup x{speedup:g}"
    click.echo(
        f"simulate {scenario}: {duration_s:g} s of event time -> {topic} at {settings.kafka_bootstrap} ({pacing})",
        err=as_json,
    )
    progress = _Progress(start_ms, duration_s, live=live, to_stderr=as_json)
    context: AbstractContextManager[Any] = progress if live else nullcontext()
    try:
        with context:
            report = asyncio.run(
                produce_messages(
                    messages,
                    topic=topic,
                    client_kwargs=kafka_client_kwargs(settings),
                    pacer=pacer,
                    on_progress=progress.update,
                )
            )
    except KeyboardInterrupt:
        raise click.Abort() from None
    except Exception as exc:  # a broker problem is a user-facing error, not a traceback
        raise click.ClickException(f"producing to {topic} failed: {exc!r}") from exc
    if as_json:
        echo_json(
            {
                "scenario": scenario,
                "topic": topic,
                "bootstrap": settings.kafka_bootstrap,
                "events": report.messages,
                "bytes": report.bytes,
                "seconds": round(report.elapsed_s, 3),
                "events_per_s": round(report.messages_per_s, 1),
            }
        )
        return
    click.echo(
        f"produced {report.messages} events ({report.bytes / 1e6:.1f} MB) in {report.elapsed_s:.1f} s: "
        f"{report.messages_per_s:,.0f} events/s"
    )
