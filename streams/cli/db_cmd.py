"""``ttft db``: the ClickHouse store's schema."""

from __future__ import annotations

import time

import click

from streams.cli.conventions import echo_json, json_option
from streams.settings import load_settings, redact_url
from streams.store.client import StoreConfigError, StoreUnavailable, make_client
from streams.store.migrate import MigrationStep, apply_migrations

#: A statement running longer than this gets its duration printed when it ends.
_SLOW_S = 1.0


def _show_progress(step: MigrationStep) -> None:
    """Progress on stderr, one line per statement (stdout stays the result, JSON with --json)."""
    if step.seconds is None:
        click.echo(f"{step.name} [{step.index}/{step.total}] {step.summary}", err=True)
    elif step.seconds >= _SLOW_S:
        click.echo(f"{step.name} [{step.index}/{step.total}] done in {step.seconds:.1f} s", err=True)


@click.group()
def db() -> None:
    """The ClickHouse store (TTFT_CLICKHOUSE_URL, TTFT_CLICKHOUSE_DATABASE)."""


@db.command()
@json_option("Print {database, store, applied, seconds} as JSON (progress stays on stderr).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def migrate(as_json: bool, quiet: bool) -> None:
    """Create the database and apply the migrations it lacks, in order (idempotent).

    Each statement is announced on stderr before it runs (a data copy can take a while on a big table).
    """
    settings = load_settings()
    try:
        client = make_client(settings)
    except (StoreConfigError, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    database = settings.clickhouse_database
    started = time.monotonic()
    applied = apply_migrations(client, database, progress=None if quiet else _show_progress)
    seconds = time.monotonic() - started
    store = redact_url(settings.store_url)
    if as_json:
        echo_json({"database": database, "store": store, "applied": applied, "seconds": round(seconds, 3)})
        return
    where = f"{database} at {store}"
    if not applied:
        click.echo(f"{where}: up to date")
        return
    for name in applied:
        click.echo(f"applied {name}")
    click.echo(f"{where}: {len(applied)} migration(s) applied in {seconds:.1f} s")
