"""Dashboard 6: one request (``ttft request <id>`` in Grafana): its stages as a waterfall, its attributes, and
links to its trace, its tenant's overview and its version's canary board.

``$request_id`` is a text box (the "Slowest requests" tables link here with it); empty, the board shows the
slowest request of the range among the selected tenants. The store keeps each stage's duration, not its
start: the waterfall lays the stages out as the request ran them (retrieval, then prompt assembly, then the
LLM's first token, the unattributed gap last; inside retrieval the two recalls side by side for parallel
recall, one after the other for serial, rerank after them), the way ``ttft whatif`` replays a request.
"""

from __future__ import annotations

from typing import Final

from streams.grafana.boards_latency import IN_RANGE, tenant_variable
from streams.grafana.links import REQUEST, key_columns, to_canary, to_overview, to_trace
from streams.grafana.model import FORMAT_TABLE, DashboardSpec, PanelSpec, VariableSpec
from streams.grafana.panels_whatif import serial_recall
from streams.grafana.sql import TENANT, string_array, where
from streams.settings import Settings

#: The request the board shows: the one typed or linked, else the slowest of the range (selected tenants).
_CHOSEN: Final = "decodeURLComponent('${request_id:percentencode}')"
_SLOWEST: Final = (
    f"(SELECT request_id FROM requests FINAL {where(IN_RANGE, 'ttft_ms IS NOT NULL', TENANT)} "
    "ORDER BY ttft_ms DESC, request_id LIMIT 1)"
)
THE_REQUEST: Final = f"request_id = if({_CHOSEN} != '', {_CHOSEN}, {_SLOWEST})"
#: Several tenants may use the same id: one row per tenant, at most this many.
MAX_TENANTS: Final = 10
WATERFALL_STAGES: Final = (
    "ttft",
    "retrieval",
    "vector_recall",
    "bm25_recall",
    "rerank",
    "prompt_assemble",
    "llm_ttft",
    "other",
)
#: (attribute shown, expression): what ``ttft request`` prints besides the stages.
ATTRIBUTES: Final = (
    ("status", "status"),
    ("missing_stages", "missing_stages"),
    ("rollout", "rollout"),
    ("route", "route"),
    ("fallback_level", "fallback_level"),
    ("recall_mode", "recall_mode"),
    ("rerank_top_k", "rerank_top_k"),
    ("retrieval_cache_hit", "retrieval_cache_hit"),
    ("prompt_tokens", "prompt_tokens"),
    ("cached_tokens", "cached_tokens"),
    ("prompt_cache_hit", "prompt_cache_hit"),
    ("draft_accept_rate", "draft_accept_rate"),
    ("custom_stages_ms", "custom_stages"),
    ("stage_repeats", "stage_repeats"),
    ("window_start", "window_start"),
    ("event_count", "event_count"),
    ("duplicate_events", "duplicate_events"),
    ("late_events", "late_events"),
    ("record_version", "record_version"),
)


def request_id_variable() -> VariableSpec:
    return VariableSpec("request_id", "Request id", "", kind="textbox", default="")


def _one_request(columns: str) -> str:
    """The chosen request's row (of the first selected tenant holding that id)."""
    return f"SELECT {columns}\nFROM requests FINAL\n{where(THE_REQUEST, TENANT)}\nORDER BY tenant_id\nLIMIT 1"


def _expect() -> str:
    return f"SELECT count() FROM requests FINAL\n{where(THE_REQUEST, TENANT)}"


def _request(settings: Settings) -> PanelSpec:
    sql = (
        "SELECT request_id, tenant_id, version_id, status, started_at, first_token_at, ttft_ms, trace_id,\n"
        f"       {key_columns()}\n"
        "FROM requests FINAL\n"
        f"{where(THE_REQUEST, TENANT)}\n"
        f"ORDER BY tenant_id\nLIMIT {MAX_TENANTS}"
    )
    return PanelSpec(
        title="Request",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=(
            "request_id",
            "tenant_id",
            "version_id",
            "status",
            "started_at",
            "first_token_at",
            "ttft_ms",
            "trace_id",
            "tenant_key",
            "version_key",
        ),
        expect_sql=_expect(),
        description="The request $request_id (empty: the slowest of the range). trace_id opens the trace "
        "(dashboards.trace_url: Jaeger or Tempo), tenant_id the overview, version_id the canary board.",
        links={
            "trace_id": (to_trace(settings),),
            "tenant_id": (to_overview(),),
            "version_id": (to_canary(version="row"),),
        },
        hidden=("tenant_key", "version_key"),
        width=24,
        height=5,
    )


def _waterfall_rows() -> str:
    """``stage, start_ms, duration_ms, i`` rows of the chosen request, stages in :data:`WATERFALL_STAGES` order."""
    r, p, l_ = "ifNull(r, 0)", "ifNull(p, 0)", "ifNull(l, 0)"
    recall_end = "if(serial, ifNull(v, 0) + ifNull(b, 0), greatest(ifNull(v, 0), ifNull(b, 0)))"
    starts = f"[0, 0, 0, if(serial, ifNull(v, 0), 0), {recall_end}, {r}, {r} + {p}, {r} + {p} + {l_}]"
    durations = "[t, r, v, b, k, p, l, if(o IS NULL, NULL, greatest(assumeNotNull(o), 0))]"
    inner = _one_request(
        "ttft_ms AS t, retrieval_ms AS r, vector_recall_ms AS v, bm25_recall_ms AS b, rerank_ms AS k,\n"
        "       prompt_assemble_ms AS p, llm_ttft_ms AS l, other_ms AS o, recall_mode AS mode, stage_repeats"
    )
    return (
        "SELECT stage, start_ms, duration_ms, i, t, stage_repeats\n"
        "FROM (\n"
        f"  SELECT *, {serial_recall()} AS serial\n"
        f"  FROM ({inner})\n"
        ")\n"
        f"ARRAY JOIN {string_array(WATERFALL_STAGES)} AS stage, {starts} AS start_ms,\n"
        f"  {durations} AS duration_ms, arrayEnumerate({string_array(WATERFALL_STAGES)}) AS i\n"
        "WHERE duration_ms IS NOT NULL"
    )


def _waterfall() -> PanelSpec:
    sql = f"SELECT stage, start_ms, duration_ms\nFROM (\n{_waterfall_rows()}\n)\nORDER BY i"
    # Drawn (it offsets the stacked bar) but invisible; its value stays in the tooltip as the start.
    hide = {"legend": True, "tooltip": False, "viz": False}
    return PanelSpec(
        title="Stages (waterfall)",
        kind="barchart",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("stage", "start_ms", "duration_ms"),
        expect_sql=_expect(),
        description="Each stage of the request from its start to its end (ms since the request started). "
        "The store keeps durations: starts follow the request's order (retrieval, prompt assembly, the LLM's "
        "first token, then the unattributed gap); parallel recalls side by side, serial ones in a row.",
        options={"xField": "stage"},
        overrides=(
            {
                "matcher": {"id": "byName", "options": "start_ms"},
                "properties": [
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "transparent"}},
                    {"id": "custom.hideFrom", "value": hide},
                ],
            },
        ),
        width=12,
        height=10,
    )


def _stage_table() -> PanelSpec:
    sql = (
        "SELECT stage, start_ms, duration_ms, duration_ms / t AS share_of_ttft, stage_repeats[stage] AS repeats\n"
        f"FROM (\n{_waterfall_rows()}\n)\nORDER BY i"
    )
    return PanelSpec(
        title="Stages",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("stage", "start_ms", "duration_ms", "share_of_ttft", "repeats"),
        expect_sql=_expect(),
        description="The request's stages with their share of its TTFT and how often each ran (retries). Parts "
        "of retrieval (vector_recall, bm25_recall, rerank) are inside it, not extra time.",
        width=12,
        height=10,
    )


def _attributes() -> PanelSpec:
    names = string_array(name for name, _ in ATTRIBUTES)
    values = ", ".join(f"ifNull(toString({expr}), '')" for _, expr in ATTRIBUTES)
    inner = _one_request(", ".join(expr for _, expr in ATTRIBUTES))
    sql = (
        "SELECT attribute, value\n"
        f"FROM ({inner})\n"
        f"ARRAY JOIN {names} AS attribute, [{values}] AS value, arrayEnumerate({names}) AS i\n"
        "WHERE value != ''\nORDER BY i"
    )
    return PanelSpec(
        title="Attributes",
        kind="table",
        sql=sql,
        fmt=FORMAT_TABLE,
        columns=("attribute", "value"),
        expect_sql=_expect(),
        description="What the request's spans said besides the stages (empty ones left out): routing, recall, "
        "cache, speculative decoding, retries, and how its record was assembled (events, duplicates, late ones).",
        unit="none",
        width=24,
        height=10,
    )


def request_board(settings: Settings) -> DashboardSpec:
    """Dashboard 6: one request."""
    return DashboardSpec(
        uid=REQUEST[0],
        slug=REQUEST[1],
        title="TTFT request",
        description="One request: its stages as a waterfall, its attributes and its trace. Opened from "
        "'Slowest requests' with $request_id; empty, the slowest request of the range.",
        variables=(tenant_variable(), request_id_variable()),
        panels=(_request(settings), _waterfall(), _stage_table(), _attributes()),
    )
