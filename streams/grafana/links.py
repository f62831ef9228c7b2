"""Links between the boards: overview -> drill-down -> canary -> request, carrying the time range and the
variables, and from a request to its trace.

Tenant and version variables hold the hex of the id (:func:`streams.grafana.sql.hex_variable_sql`), so a link
built from a table row passes ``var-tenant=<hex>``: the panels return the hex beside the id in a hidden column
(:data:`TENANT_KEY`, :data:`VERSION_KEY`) and the link reads it with ``${__data.fields.<column>}``. A stage
name is ``[a-z][a-z0-9_]*`` and a request id is percent-encoded. Board uids and variable names are a contract
(alerts link here too): docs/grafana.md lists them.
"""

from __future__ import annotations

from typing import Final

from streams.grafana.model import DataLink, board_url
from streams.settings import Settings

OVERVIEW: Final = ("ttft-overview", "ttft-overview")
DRILLDOWN: Final = ("ttft-stages", "ttft-stage-drilldown")
CANARY: Final = ("ttft-canary", "ttft-canary")
REQUEST: Final = ("ttft-request", "ttft-request")
#: Hidden columns holding ``hex(tenant_id)`` / ``hex(version_id)``, the values of ``$tenant`` / ``$version``.
TENANT_KEY: Final = "tenant_key"
VERSION_KEY: Final = "version_key"
TIME_RANGE: Final = "${__url_time_range}"


def key_columns(tenant: str = "tenant_id", version: str | None = "version_id") -> str:
    """SELECT-list items returning the hex keys links read (``hex()``: upper case, as the variables hold)."""
    items = [f"hex({tenant}) AS {TENANT_KEY}"]
    if version is not None:
        items.append(f"hex({version}) AS {VERSION_KEY}")
    return ", ".join(items)


def _url(board: tuple[str, str], *params: str) -> str:
    return f"{board_url(*board)}?{'&'.join((*params, TIME_RANGE))}"


def tenant_param() -> str:
    return f"var-tenant=${{__data.fields.{TENANT_KEY}}}"


def version_param() -> str:
    return f"var-version=${{__data.fields.{VERSION_KEY}}}"


def _selection(tenant: str | None, version: str | None, stage: str | None) -> list[str]:
    """URL parameters: ``"row"`` takes the id from the row's hidden key, ``"keep"`` the source board's current
    selection (``${var:queryparam}``: only for a variable the source board has), None leaves it out; ``stage``
    may also be an expression (``${__value.raw}``, ``${__data.fields.stage}``)."""
    params: list[str] = []
    for name, how, from_row in (("tenant", tenant, tenant_param), ("version", version, version_param)):
        if how == "row":
            params.append(from_row())
        elif how == "keep":
            params.append(f"${{{name}:queryparam}}")
    if stage == "keep":
        params.append("${stage:queryparam}")
    elif stage is not None:
        params.append(f"var-stage={stage}")
    return params


def to_drilldown(tenant: str | None = "row", version: str | None = "keep", stage: str | None = None) -> DataLink:
    """The stage drill-down for the row's tenant, version and stage (see :func:`_selection`)."""
    return DataLink("Stage drill-down for this row", _url(DRILLDOWN, *_selection(tenant, version, stage)))


def to_canary(tenant: str | None = "row", version: str | None = "keep", stage: str | None = None) -> DataLink:
    """The canary board, selected as :func:`to_drilldown` selects."""
    return DataLink("Canary board for this row", _url(CANARY, *_selection(tenant, version, stage)))


def to_overview() -> DataLink:
    return DataLink("Overview for this tenant", _url(OVERVIEW, tenant_param()))


def to_request() -> DataLink:
    """The per-request board for the cell's request id (of the row's tenant)."""
    return DataLink("This request", _url(REQUEST, "var-request_id=${__value.raw:percentencode}", tenant_param()))


def to_trace(settings: Settings) -> DataLink:
    """The cell's trace in Jaeger or Tempo: ``dashboards.trace_url`` with ``{trace_id}`` filled in."""
    url = settings.dashboards.trace_url.replace("{trace_id}", "${__value.raw:percentencode}")
    return DataLink("Trace", url, target_blank=True)
