"""The store queries of ``ttft breakdown`` and ``ttft report`` (the only views module that touches SQL).

Every aggregate table is a ReplacingMergeTree, so each query reads ``FINAL``. Sketches are merged in SQL
with ``sumMap(bins)`` + ``sum(zero_count)`` per requested group and turned into percentiles in Python by
:func:`streams.core.sketch.quantile_from_bins`: ClickHouse ``quantile*`` is never used, and stored
percentile columns are never averaged. Times leave SQL as epoch milliseconds. The same functions serve the
embedded chDB store and a server (one clickhouse-connect client API).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clickhouse_connect.driver.client import Client

from streams.core.whatif import RequestColumns
from streams.store.client import check_identifier
from streams.store.request_columns import read_request_columns
from streams.store.requests_store import final_read_settings
from streams.views.span import Anchor, Span, resolve_span

_SPAN = (
    "window_start >= fromUnixTimestamp64Milli({start:Int64}, 'UTC') "
    "AND window_start < fromUnixTimestamp64Milli({end:Int64}, 'UTC')"
)
_TENANT = "({tenant:String} = '' OR tenant_id = {tenant:String})"
_VERSION = "({version:String} = '' OR version_id = {version:String})"
#: How far before the span alert transitions are read, so an alert that went pending earlier still shows.
ALERT_LOOKBACK_MS = 86_400_000


def _params(span: Span, tenant: str | None, version: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "start": span.start_ms,
        "end": span.end_ms,
        "tenant": tenant or "",
        "version": version or "",
        **extra,
    }


def _bucket(bucket_ms: int | None) -> str:
    """SQL for the epoch-ms start of a row's time bucket (the span start when not bucketed)."""
    if bucket_ms is None:
        return "{start:Int64}"
    return (
        "{start:Int64} + intDiv(toUnixTimestamp64Milli(window_start) - {start:Int64}, {bucket:Int64}) * {bucket:Int64}"
    )


def _named(client: Client, sql: str, params: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    # Aggregates are aliased ``<column>_`` in SQL: a ClickHouse alias named like a column would replace
    # that column everywhere in the query (WHERE included). The trailing underscore is dropped here.
    rows = client.query(sql, parameters=params, **kw).named_results()
    return [{k.removesuffix("_"): v for k, v in row.items()} for row in rows]


def table_exists(client: Client, database: str, table: str) -> bool:
    """Whether ``database.table`` exists (``alerts`` / ``canary_verdicts`` arrive with migration 0006)."""
    return bool(client.command(f"EXISTS TABLE {check_identifier(database)}.{check_identifier(table)}"))


def newest_window_start(client: Client, database: str, tenant: str | None = None) -> int | None:
    """Start (epoch ms) of the newest stored ``stage_windows`` window, for one tenant or all."""
    sql = (
        f"SELECT toUnixTimestamp64Milli(max(window_start)) AS ws, count() AS n "
        f"FROM {check_identifier(database)}.stage_windows WHERE {_TENANT}"
    )
    row = _named(client, sql, {"tenant": tenant or ""})[0]
    return int(row["ws"]) if row["n"] else None


def tenants_in_span(client: Client, database: str, span: Span) -> list[str]:
    """Tenants with ``stage_windows`` rows in the span, sorted."""
    sql = f"SELECT DISTINCT tenant_id FROM {check_identifier(database)}.stage_windows WHERE {_SPAN} ORDER BY tenant_id"
    return [str(r["tenant_id"]) for r in _named(client, sql, _params(span, None))]


def stage_rows(
    client: Client,
    database: str,
    span: Span,
    tenant: str | None = None,
    version: str | None = None,
    *,
    bucket_ms: int | None = None,
    by_version: bool = True,
) -> list[dict[str, Any]]:
    """``stage_windows`` merged per (bucket, tenant[, version], stage): the shape :class:`SketchRollup` adds.

    ``window_start`` of a result row is its bucket start (the span start without ``bucket_ms``);
    ``windows`` counts the merged window rows. Without ``by_version`` the versions are merged
    (``version_id`` is then ``"*"``).
    """
    version_col = "version_id" if by_version else "'*'"
    sql = (
        f"SELECT {_bucket(bucket_ms)} AS window_start_, tenant_id, {version_col} AS version_id_, stage, "
        "relative_accuracy, sum(count) AS count_, max(max) AS max_, sumMap(bins) AS bins_, "
        "sum(zero_count) AS zero_count_, sum(slo_bad_count) AS slo_bad_count_, "
        "sum(negative_count) AS negative_count_, count() AS windows "
        f"FROM {check_identifier(database)}.stage_windows FINAL "
        f"WHERE {_SPAN} AND {_TENANT} AND {_VERSION} "
        "GROUP BY window_start_, tenant_id, version_id_, stage, relative_accuracy "
        "ORDER BY window_start_, tenant_id, version_id_, stage"
    )
    return _named(client, sql, _params(span, tenant, version, bucket=bucket_ms or 1))


def attribution_rows(
    client: Client, database: str, span: Span, tenant: str | None = None, version: str | None = None
) -> list[dict[str, Any]]:
    """Per-window ``tail_attribution`` rows of the span (their shares are combined by tail/band counts)."""
    sql = (
        "SELECT toUnixTimestamp64Milli(window_start) AS window_start_, tenant_id, version_id, status, n, "
        "ttft_p95, tail_count, band_count, biggest_p95_stage, tail_dominant_stage, stage_p95, tail_share, "
        "band_share, share_delta, exemplar_request_ids "
        f"FROM {check_identifier(database)}.tail_attribution FINAL "
        f"WHERE {_SPAN} AND {_TENANT} AND {_VERSION} ORDER BY tenant_id, version_id, window_start"
    )
    return _named(client, sql, _params(span, tenant, version))


def health_rows(
    client: Client,
    database: str,
    span: Span,
    tenant: str | None = None,
    version: str | None = None,
    *,
    bucket_ms: int | None = None,
) -> list[dict[str, Any]]:
    """``window_health`` counts summed per (bucket, tenant): shares are recomputed from the sums."""
    counts = (
        "total",
        "complete",
        "missing_stage",
        "no_first_chunk",
        "timed_out",
        "orphan",
        "late_events",
        "late_amendments",
        "amendments",
        "dead_letters",
        "duplicate_events",
        "overflow_series",
    )
    sums = ", ".join(f"sum({c}) AS {c}_" for c in counts)
    sql = (
        f"SELECT {_bucket(bucket_ms)} AS window_start_, tenant_id, {sums}, count() AS windows "
        f"FROM {check_identifier(database)}.window_health FINAL "
        f"WHERE {_SPAN} AND {_TENANT} AND {_VERSION} "
        "GROUP BY window_start_, tenant_id ORDER BY window_start_, tenant_id"
    )
    return _named(client, sql, _params(span, tenant, version, bucket=bucket_ms or 1))


def signal_rows(
    client: Client, database: str, span: Span, tenant: str | None = None, version: str | None = None
) -> list[dict[str, Any]]:
    """``llm_signals`` per tenant x version over the span: summed counts and mixes, newest draft percentiles.

    Draft-acceptance percentiles cannot be merged (no sketch is stored), so the newest window that had
    draft data is reported as is, with its window start.
    """
    sql = (
        "SELECT tenant_id, version_id, sum(requests) AS requests_, "
        "sum(prompt_cache_known) AS prompt_cache_known_, sum(prompt_cache_hits) AS prompt_cache_hits_, "
        "sum(prompt_tokens_known) AS prompt_tokens_known_, sum(below_cacheable) AS below_cacheable_, "
        "sum(draft_accept_count) AS draft_accept_count_, "
        "argMaxIf(draft_accept_p50, window_start, draft_accept_count > 0) AS draft_accept_p50_, "
        "argMaxIf(draft_accept_p10, window_start, draft_accept_count > 0) AS draft_accept_p10_, "
        "toUnixTimestamp64Milli(maxIf(window_start, draft_accept_count > 0)) AS draft_window_start, "
        "sumMap(route_mix) AS route_mix_, sumMap(fallback_mix) AS fallback_mix_, "
        "sumMap(recall_mode_mix) AS recall_mode_mix_ "
        f"FROM {check_identifier(database)}.llm_signals FINAL "
        f"WHERE {_SPAN} AND {_TENANT} AND {_VERSION} "
        "GROUP BY tenant_id, version_id ORDER BY tenant_id, version_id"
    )
    return _named(client, sql, _params(span, tenant, version))


def version_rollouts(client: Client, database: str, span: Span, tenant: str | None = None) -> list[dict[str, Any]]:
    """Per tenant x version in ``requests``: how many records were served as ``canary`` / ``stable``."""
    sql = (
        "SELECT tenant_id, version_id, countIf(rollout = 'canary') AS canary, "
        "countIf(rollout = 'stable') AS stable, count() AS records "
        f"FROM {check_identifier(database)}.requests FINAL WHERE {_SPAN} AND {_TENANT} "
        "GROUP BY tenant_id, version_id ORDER BY tenant_id, version_id"
    )
    return _named(client, sql, _params(span, tenant), settings=final_read_settings(client))


def canary_verdict_rows(client: Client, database: str, span: Span, tenant: str | None = None) -> list[dict[str, Any]]:
    """``canary_verdicts`` of the span, oldest first (empty when the table does not exist)."""
    if not table_exists(client, database, "canary_verdicts"):
        return []
    sql = (
        "SELECT toUnixTimestamp64Milli(window_start) AS window_start_, tenant_id, stage, canary_version, "
        "stable_versions, verdict, reason, n_canary, n_stable, p95_canary, p95_stable, ratio, explanation "
        f"FROM {check_identifier(database)}.canary_verdicts FINAL WHERE {_SPAN} AND {_TENANT} "
        "ORDER BY window_start, tenant_id, stage, canary_version"
    )
    return _named(client, sql, _params(span, tenant))


def alert_rows(client: Client, database: str, span: Span, tenant: str | None = None) -> list[dict[str, Any]]:
    """Alert transitions from a day before the span to its end, oldest first (empty without the table).

    Tenant-less alerts (``TTFTIngestHalted``, ``Watchdog``) are included with any tenant filter.
    """
    if not table_exists(client, database, "alerts"):
        return []
    sql = (
        "SELECT fingerprint, alertname, tenant_id, stage, version_id, severity, state, labels, annotations, "
        "toUnixTimestamp64Milli(event_at) AS event_at_, toUnixTimestamp64Milli(active_at) AS active_at_, "
        "toUnixTimestamp64Milli(fired_at) AS fired_at_, toUnixTimestamp64Milli(resolved_at) AS resolved_at_, "
        "muted "
        f"FROM {check_identifier(database)}.alerts FINAL "
        "WHERE event_at >= fromUnixTimestamp64Milli({from:Int64}, 'UTC') "
        "AND event_at < fromUnixTimestamp64Milli({end:Int64}, 'UTC') "
        "AND ({tenant:String} = '' OR tenant_id = {tenant:String} OR tenant_id = '') "
        "ORDER BY event_at, fingerprint, state"
    )
    params = _params(span, tenant)
    params["from"] = span.start_ms - ALERT_LOOKBACK_MS
    return _named(client, sql, params)


def request_ttfts(
    client: Client, database: str, request_ids: Iterable[str], tenant: str | None = None
) -> dict[str, float | None]:
    """``ttft_ms`` of stored requests by id (to rank the span's exemplars), of ``tenant`` when given: a
    request is (tenant_id, request_id), so another tenant's request with the same id is not read."""
    ids = sorted(set(request_ids))
    if not ids:
        return {}
    sql = (
        f"SELECT request_id, ttft_ms FROM {check_identifier(database)}.requests FINAL "
        "WHERE request_id IN {ids:Array(String)}"
    )
    params: dict[str, Any] = {"ids": ids}
    if tenant is not None:
        sql += " AND tenant_id = {tenant:String}"
        params["tenant"] = tenant
    rows = _named(client, sql, params, settings=final_read_settings(client))
    return {str(r["request_id"]): (None if r["ttft_ms"] is None else float(r["ttft_ms"])) for r in rows}


def store_span(
    client: Client,
    database: str,
    since: str,
    until: str | None,
    *,
    window_ms: int,
    now_ms: float,
    tenant: str | None = None,
    anchor: Anchor = "data",
) -> Span:
    """Resolve ``--since`` / ``--until`` against the end of the newest stored window (see :mod:`.span`)."""
    newest = newest_window_start(client, database, tenant)
    return resolve_span(
        since,
        until,
        newest_end_ms=None if newest is None else newest + window_ms,
        now_ms=now_ms,
        anchor=anchor,
    )


def request_columns(
    client: Client,
    database: str,
    span: Span,
    tenant: str | None = None,
    version: str | None = None,
    route: str | None = None,
) -> RequestColumns:
    """The span's replayable requests (``complete``, with a TTFT) of ``tenant`` / ``version`` / ``route``
    (all when ``None``) as numpy columns, for ``ttft whatif`` (:mod:`streams.store.request_columns`)."""
    return read_request_columns(
        client, database, span.start_ms, span.end_ms, tenant=tenant, version=version, route=route
    )
