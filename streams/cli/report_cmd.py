"""``ttft report``: an HTML page with PNG charts (and report.json) from the stored aggregates."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from streams.cli.breakdown_cmd import SPAN_HELP
from streams.cli.conventions import echo_json, json_option
from streams.cli.span_reader import open_span
from streams.settings import load_settings
from streams.views.reads import tenants_in_span
from streams.views.report import build_report, report_steps


@click.command()
@click.option("--since", default="1h", show_default=True, help=f"Span start: {SPAN_HELP}.")
@click.option("--until", default=None, help=f"Span end (default: the anchor): {SPAN_HELP}.")
@click.option(
    "--anchor",
    type=click.Choice(["data", "now"]),
    default="data",
    show_default=True,
    help="What relative times count back from: the newest stored window or the wall clock.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for index.html, report.json and the PNGs (created if needed).",
)
@click.option("--tenant", "tenants", multiple=True, help="Tenant(s) to include (default: all in the span).")
@json_option("Print {index, report_json, report: the numbers of report.json} as JSON instead of the verdict.")
def report(since: str, until: str | None, anchor: str, out_dir: Path, tenants: tuple[str, ...], as_json: bool) -> None:
    """Write a TTFT report: verdict, P95 over time, breakdown, tail, canary, alerts, completeness."""
    settings = load_settings()
    client, database, span = open_span(settings, "stage_windows", since, until, anchor)
    names = list(tenants) or tenants_in_span(client, database, span)
    if not names:
        raise click.ClickException("no stage windows in the span (has the worker closed any window yet?)")
    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("report", total=report_steps(len(names)))
        first = True

        def step(name: str) -> None:
            nonlocal first
            if not first:
                progress.advance(task)
            first = False
            progress.update(task, description=name)

        data = build_report(client, database, settings, span, out_dir, tenants=names, step=step)
        progress.advance(task)
    if as_json:
        numbers = orjson.loads((out_dir / "report.json").read_bytes())
        echo_json(
            {"index": str(out_dir / "index.html"), "report_json": str(out_dir / "report.json"), "report": numbers}
        )
        return
    click.echo(data.verdict)
    click.echo(f"report written to {out_dir / 'index.html'} (numbers in {out_dir / 'report.json'})")
