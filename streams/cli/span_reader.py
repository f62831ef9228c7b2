"""What the read commands (``breakdown``, ``report``, ``whatif``) do first: open the store for reading (a
live writer's interface, else the store itself), check that the table they read exists, and resolve
``--since``/``--until`` into a span of the stored data, each failure as a clear CLI error."""

from __future__ import annotations

import time

import click
from clickhouse_connect.driver.client import Client

from streams.settings import Settings
from streams.store.client import StoreConfigError, StoreUnavailable, check_identifier
from streams.store.live import reader_client
from streams.views.reads import store_span, table_exists
from streams.views.span import Span, SpanError


def open_span(
    settings: Settings, table: str, since: str, until: str | None, anchor: str, tenant: str | None = None
) -> tuple[Client, str, Span]:
    """(client, database, span) for a read command, or a click error saying what is missing."""
    try:
        client = reader_client(settings)
    except (StoreConfigError, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    database = check_identifier(settings.clickhouse_database)
    if not table_exists(client, database, table):
        raise click.ClickException(f"no {table} table in {database}: run 'ttft db migrate' first")
    try:
        span = store_span(
            client,
            database,
            since,
            until,
            window_ms=settings.windows.window_s * 1000,
            now_ms=time.time() * 1000.0,
            tenant=tenant,
            anchor="now" if anchor == "now" else "data",
        )
    except SpanError as exc:
        raise click.BadParameter(str(exc)) from None
    return client, database, span
