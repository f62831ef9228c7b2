"""``ttft demo``: broker, workers, Alertmanager, the seed's story and a bad canary, a live view, a report."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.console import Console

from streams.cli.simulate_cmd import parse_duration_s


@click.command("demo")
@click.option(
    "--duration",
    default="180",
    show_default=True,
    help="Wall time of the traffic (90, 90s, 3m); set-up, draining and the report add a minute or two.",
)
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Demo home, wiped at each run [default: $TTFT_HOME/demo].",
)
@click.option("--seed", type=int, default=7, show_default=True, help="Simulator seed: same seed, same story.")
@click.option("--no-alertmanager", is_flag=True, help="Do not start Alertmanager even when it is installed.")
@click.option("--plain", is_flag=True, help="Plain progress lines even on a terminal.")
@click.option(
    "--otel",
    is_flag=True,
    help="Also start the OpenTelemetry Collector (built by `make otelcol`) and send tenant otel-demo's "
    "traffic as OTLP traces from an SDK-instrumented generator through it; the other tenants use the emitter.",
)
def demo(duration: str, home: Path | None, seed: int, no_alertmanager: bool, plain: bool, otel: bool) -> None:
    """Replay the seed's story and a canary regression through the real pipeline, compressed in event time.

    Starts a local Kafka broker, Alertmanager (when installed), the writer and a join worker, produces
    simulated traffic, shows a live view, prints the breakdown, the before/after P95s and the alerts
    that fired, and writes a report. Everything it started is stopped at the end, and on Ctrl-C.
    With --otel, one tenant comes in through the OpenTelemetry Collector instead
    (`make demo DEMO_ARGS=--otel` builds the Collector first).
    """
    from streams.demo.run import DemoError, DemoOptions, run_demo

    options = DemoOptions(
        duration_s=parse_duration_s(duration),
        home=home,
        seed=seed,
        alertmanager=not no_alertmanager,
        live=False if plain else None,
        otel=otel,
    )
    console = Console(highlight=False)
    if not console.is_terminal:
        # A pipe or CI log: lines are never broken (a path or a verdict stays greppable on one line, whatever
        # COLUMNS a parent set), and tables get 120 columns rather than rich's 80 unless COLUMNS says otherwise.
        width = None if "COLUMNS" in os.environ else 120
        console = Console(highlight=False, width=width, soft_wrap=True)
    try:
        code = run_demo(options, console)
    except KeyboardInterrupt:
        console.print("demo interrupted: everything it started has been stopped", markup=False)
        sys.exit(130)
    except (DemoError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
