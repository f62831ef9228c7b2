"""``ttft breakdown``: the stage P95 table, sum-vs-true TTFT P95, tail attribution, completeness, advice."""

from __future__ import annotations

import click
import orjson
from rich.console import Console

from streams.cli.conventions import model_version, model_version_option
from streams.cli.span_reader import open_span
from streams.settings import load_settings
from streams.views.breakdown import compute_breakdown, render_breakdown
from streams.views.reads import tenants_in_span

SPAN_HELP = (
    "a duration (1h, 30m, 1h30m) counted back from the end of the newest stored window (see --anchor), "
    "or an ISO 8601 time (naive = UTC)"
)


@click.command()
@click.option("--tenant", "tenant", default=None, help="Tenant id (default: each tenant in the span, in turn).")
@model_version_option("One model/prompt version (default: all versions merged).")
@click.option("--since", default="1h", show_default=True, help=f"Span start: {SPAN_HELP}.")
@click.option("--until", default=None, help=f"Span end (default: the anchor): {SPAN_HELP}.")
@click.option(
    "--anchor",
    type=click.Choice(["data", "now"]),
    default="data",
    show_default=True,
    help="What relative times count back from: the newest stored window (works on historical, replayed "
    "or simulated data) or the wall clock.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON instead of tables.")
def breakdown(
    tenant: str | None,
    version: str | None,
    old_version: str | None,
    since: str,
    until: str | None,
    anchor: str,
    as_json: bool,
) -> None:
    """Where TTFT goes, per stage, and which stage to cut first."""
    version = model_version(version, old_version)
    settings = load_settings()
    client, database, span = open_span(settings, "stage_windows", since, until, anchor, tenant)
    tenants = [tenant] if tenant is not None else tenants_in_span(client, database, span)
    if not tenants:
        raise click.ClickException("no stage windows in the span (has the worker closed any window yet?)")
    results = [compute_breakdown(client, database, settings, span, tenant=t, version=version) for t in tenants]
    if as_json:
        payload = results[0].to_json() if tenant is not None else [b.to_json() for b in results]
        click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
        return
    console = Console()
    for result in results:
        render_breakdown(console, result)
