"""``ttft request <id>``: one stored request record, its status and stages."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from schemas.records import ATTR_COLUMNS, STAGE_COLUMNS
from streams.settings import SUB_STAGES, load_settings
from streams.store.client import StoreConfigError, StoreUnavailable, check_identifier
from streams.store.live import reader_client
from streams.store.requests_store import fetch_request, fetch_request_all_tenants, fetch_requests_by_trace

#: An OpenTelemetry trace id: ``ttft request`` falls back to it when no request has the given id.
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_STATUS_STYLE = {
    "complete": "green",
    "missing_stage": "yellow",
    "no_first_chunk": "cyan",
    "timed_out": "red",
    "orphan": "magenta",
}


@click.command()
@click.argument("request_id")
@click.option("--tenant", default=None, help="The tenant whose request it is (needed when several share the id).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
def request(request_id: str, tenant: str | None, as_json: bool) -> None:
    """Show the stored record of REQUEST_ID, or of an OpenTelemetry trace id (exit status 1 if not stored)."""
    settings = load_settings()
    try:
        client = reader_client(settings)
    except (StoreConfigError, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    database = check_identifier(settings.clickhouse_database)
    if not client.command(f"EXISTS TABLE {database}.requests"):
        raise click.ClickException(f"no requests table in {database}: run 'ttft db migrate' first")
    if tenant is None:
        tenants = [r["tenant_id"] for r in fetch_request_all_tenants(client, database, request_id)]
        if len(tenants) > 1:
            raise click.ClickException(
                f"request {request_id!r} exists for {len(tenants)} tenants ({', '.join(map(repr, tenants[:5]))}): "
                "pass --tenant"
            )
    record = fetch_request(client, database, request_id, tenant)
    if record is None and _TRACE_ID.fullmatch(request_id):
        record = _by_trace(client, database, request_id, tenant)
    if record is None:
        click.echo(f"request {request_id!r} not found", err=True)
        raise SystemExit(1)
    if as_json:
        click.echo(orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())
    else:
        show_record(Console(), record)


def _by_trace(client: Any, database: str, trace_id: str, tenant: str | None) -> dict[str, Any] | None:
    """The one request linked to OpenTelemetry trace ``trace_id`` (of ``tenant``, when given), if any: a
    request mapped from spans carrying ``ttft.request_id`` is stored under that id, not the trace id."""
    records = [r for r in fetch_requests_by_trace(client, database, trace_id) if tenant in (None, r["tenant_id"])]
    if len(records) > 1:
        keys = ", ".join(f"{r['tenant_id']!r}/{r['request_id']!r}" for r in records[:5])
        raise click.ClickException(f"trace {trace_id} links {len(records)} requests ({keys}): pass --tenant")
    return records[0] if records else None


def _time(ms: float | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _ms(value: float | None) -> str:
    return "NULL" if value is None else f"{value:,.1f}"


def show_record(console: Console, record: dict[str, Any]) -> None:
    """Render one request record: header, stages (with share of TTFT), missing stages and attrs."""
    status = record["status"]
    console.print(
        f"[bold]{record['request_id']}[/bold]  status [{_STATUS_STYLE.get(status, 'white')}]{status}[/]"
        f"  tenant {record['tenant_id']}  version {record['version_id']}"
        f"  rollout {record.get('rollout') or '-'}  route {record.get('route') or '-'}",
        markup=True,
        highlight=False,
    )
    console.print(
        f"started {_time(record['started_at'])}  first token {_time(record.get('first_token_at'))}"
        f"  window {_time(record['window_start'])}  fallback level {record.get('fallback_level', 0)}",
        highlight=False,
    )
    ttft = record.get("ttft_ms")
    table = Table(title=f"TTFT {_ms(ttft)} ms")
    table.add_column("stage")
    table.add_column("ms", justify="right")
    table.add_column("share of TTFT", justify="right")
    table.add_column("repeats", justify="right")
    repeats = record.get("stage_repeats") or {}
    stages = [(c.removesuffix("_ms"), record.get(c)) for c in (*STAGE_COLUMNS, "other_ms")]
    stages += sorted((record.get("custom_stages") or {}).items())
    for stage, value in stages:
        label = f"  {stage}" if stage in SUB_STAGES else stage  # parts of retrieval, not extra time
        share = f"{100 * value / ttft:.1f} %" if value is not None and ttft else "-"
        table.add_row(label, _ms(value), share, str(repeats.get(stage, "")))
    console.print(table)
    missing = record.get("missing_stages") or []
    console.print(f"missing stages: {', '.join(missing) if missing else 'none'}", highlight=False)
    unmeasured = record.get("llm_unmeasured_ms")
    if unmeasured is not None:
        console.print(
            f"LLM call, no first chunk in its telemetry: {_ms(unmeasured)} ms (TTFT unknown: docs/otlp-mapping.md)",
            highlight=False,
        )
    attrs = {name: record.get(name) for name in ATTR_COLUMNS if record.get(name) is not None}
    if record.get("recall_mode"):
        attrs["recall_mode"] = record["recall_mode"]
    console.print("attrs: " + (", ".join(f"{k}={v}" for k, v in attrs.items()) if attrs else "none"), highlight=False)
    console.print(
        f"events {record.get('event_count')}  duplicates {record.get('duplicate_events')}"
        f"  late {record.get('late_events')}  version {record.get('record_version')}"
        + ("  (amendment without its base record)" if record.get("amend") else ""),
        highlight=False,
    )
