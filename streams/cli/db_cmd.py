"""``ttft db``: the ClickHouse store's schema."""

from __future__ import annotations

import click

from streams.settings import load_settings, redact_url
from streams.store.client import StoreConfigError, StoreUnavailable, make_client
from streams.store.migrate import apply_migrations


@click.group()
def db() -> None:
    """The ClickHouse store (TTFT_CLICKHOUSE_URL, TTFT_CLICKHOUSE_DATABASE)."""


@db.command()
def migrate() -> None:
    """Create the database and apply the migrations it lacks, in order (idempotent)."""
    settings = load_settings()
    try:
        client = make_client(settings)
    except (StoreConfigError, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    database = settings.clickhouse_database
    applied = apply_migrations(client, database)
    where = f"{database} at {redact_url(settings.store_url)}"
    if not applied:
        click.echo(f"{where}: up to date")
        return
    for name in applied:
        click.echo(f"applied {name}")
    click.echo(f"{where}: {len(applied)} migration(s) applied")
