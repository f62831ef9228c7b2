"""The replayable requests of a span as numpy columns (``ttft whatif``, the report, the regression alert).

One ``FINAL`` read of numeric columns (a million requests are ~70 MB), fetched as Arrow and handed to numpy
without a Python object per value (``query_np`` when pyarrow is missing). NULLs become NaN or -1 in SQL,
and the aliases are unlike any column name (a ClickHouse alias named like a column would replace it
everywhere in the query). Route names come from a ``DISTINCT`` read first (without ``FINAL``: a record's
route does not change between its versions, and a name no row has left is harmless) so the rows carry a
small integer code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import NotSupportedError

from streams.core.whatif import RECALL_CODES, RequestColumns
from streams.core.whatif_levers import LEVER_STAGES
from streams.store.client import check_identifier
from streams.store.requests_store import final_read_settings

_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("ttft", "ifNull(ttft_ms, nan)"),
    *((stage, f"ifNull({stage}_ms, nan)") for stage in LEVER_STAGES),
    (
        "recall_code",
        "toUInt8(multiIf("
        + ", ".join(f"recall_mode = '{mode}', {code}" for mode, code in RECALL_CODES.items())
        + ", 0))",
    ),
    ("tokens", "toInt64(ifNull(prompt_tokens, -1))"),
    ("cached", "toInt64(ifNull(cached_tokens, -1))"),
    ("cache_hit", "toInt8(multiIf(isNull(prompt_cache_hit), -1, prompt_cache_hit, 1, 0))"),
    ("route_code", "toInt32(indexOf({routes:Array(String)}, ifNull(route, '')) - 1)"),
)
#: Complete requests with a TTFT whose window starts in ``[start, end)``, of the tenant, version and route
#: asked for ('' = all), leaving out the versions in ``excluded``.
_REPLAYABLE: Final = (
    "window_start >= fromUnixTimestamp64Milli({start:Int64}, 'UTC') "
    "AND window_start < fromUnixTimestamp64Milli({end:Int64}, 'UTC') "
    "AND ({tenant:String} = '' OR tenant_id = {tenant:String}) "
    "AND ({version:String} = '' OR version_id = {version:String}) "
    "AND ({route:String} = '' OR route = {route:String}) "
    "AND NOT has({excluded:Array(String)}, version_id) "
    "AND status = 'complete' AND ttft_ms IS NOT NULL AND first_token_at IS NOT NULL"
)


def read_request_columns(
    client: Client,
    database: str,
    start_ms: int,
    end_ms: int,
    *,
    tenant: str | None = None,
    version: str | None = None,
    route: str | None = None,
    exclude_versions: Sequence[str] = (),
) -> RequestColumns:
    """The replayable requests (``complete``, with a TTFT) whose window starts in ``[start_ms, end_ms)``, of
    ``tenant`` / ``version`` / ``route`` (all when ``None``), without the versions in ``exclude_versions``."""
    db = check_identifier(database)
    params: dict[str, Any] = {
        "start": int(start_ms),
        "end": int(end_ms),
        "tenant": tenant or "",
        "version": version or "",
        "route": route or "",
        "excluded": list(exclude_versions),
    }
    routes_sql = (
        f"SELECT DISTINCT route AS route_ FROM {db}.requests WHERE {_REPLAYABLE} "
        "AND route IS NOT NULL AND route != '' ORDER BY route_"
    )
    params["routes"] = [str(row[0]) for row in client.query(routes_sql, parameters=params).result_rows]
    select = ", ".join(f"{expr} AS {alias}" for alias, expr in _COLUMNS)
    sql = f"SELECT {select} FROM {db}.requests FINAL WHERE {_REPLAYABLE}"
    columns = _numeric_columns(client, sql, params, [alias for alias, _ in _COLUMNS])
    return RequestColumns(
        ttft=columns["ttft"].astype(np.float64, copy=False),
        stages={stage: columns[stage].astype(np.float64, copy=False) for stage in LEVER_STAGES},
        recall_mode=columns["recall_code"].astype(np.uint8, copy=False),
        prompt_tokens=columns["tokens"].astype(np.int64, copy=False),
        prompt_cache_hit=columns["cache_hit"].astype(np.int8, copy=False),
        route=columns["route_code"].astype(np.int32, copy=False),
        route_names=tuple(params["routes"]),
        cached_tokens=columns["cached"].astype(np.int64, copy=False),
    )


def _numeric_columns(client: Client, sql: str, params: dict[str, Any], names: list[str]) -> dict[str, Any]:
    settings = final_read_settings(client)
    try:
        table = client.query_arrow(sql, parameters=params, settings=settings)
    except NotSupportedError:  # no pyarrow: numpy's structured rows, one copy per column
        rows = client.query_np(sql, parameters=params, settings=settings)
        return {name: np.ascontiguousarray(rows[name]) for name in names}
    return {name: table.column(name).to_numpy() for name in names}
