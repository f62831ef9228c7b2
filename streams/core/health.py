"""Completeness (``window_health``) and LLM lever signals (``llm_signals``) per window x tenant x version.

``window_health`` says whether the latency numbers can be trusted: the share of each record status, late
events folded into records, late amendments (records that arrived after the window closed), how often the
window was recomputed, dead letters, and whether the series cap folded series into ``__other__``.

``llm_signals`` says what the LLM levers are doing: prompt-cache hit rate, share of prompts too short to be
cacheable, speculative-decoding draft acceptance (P50 and P10, exact lower order statistics), route,
fallback-level and recall-mode mixes, and rerank top-k. They use every record of the window, whatever its
status, because the levers act before the request completes or fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

from schemas.records import STATUS_ORDER
from streams.core.series import Series, SeriesAssignment
from streams.core.sketch import rank_lower
from streams.core.stages import UNKNOWN, Record
from streams.settings import Settings

#: Caller-supplied counts keyed by ``(tenant, version)``, or by tenant alone (booked on version ``unknown``).
_N = TypeVar("_N", int, float)

SeriesCounts: TypeAlias = Mapping[tuple[str, str], int] | Mapping[str, int] | Mapping[tuple[str, str] | str, int]


def series_key(key: tuple[str, str] | str) -> Series:
    """The series of a caller count key: a bare tenant means version ``unknown``."""
    return (key, UNKNOWN) if isinstance(key, str) else (key[0], key[1])


def record_series(record: Record) -> Series:
    """(tenant, version) of a record; a record without a version is version ``unknown``."""
    return str(record["tenant_id"]), str(record.get("version_id") or UNKNOWN)


def resolve_counts(counts: SeriesCounts, assignment: SeriesAssignment) -> dict[Series, int]:
    """Re-key caller counts by the admitted series (overflow adds up under ``__other__``)."""
    out: dict[Series, int] = {}
    for key, n in counts.items():
        series = assignment.resolve(*series_key(key))
        out[series] = out.get(series, 0) + int(n)
    return out


def lower_quantile(sorted_values: Sequence[_N], q: float) -> _N | None:
    """numpy ``quantile(values, q, method='lower')`` of already sorted values; ``None`` when empty."""
    if not sorted_values:
        return None
    return sorted_values[rank_lower(q, len(sorted_values))]


def window_health_row(
    window_start: int,
    series: Series,
    records: Sequence[Record],
    *,
    late_amendments: int = 0,
    dead_letters: int = 0,
    amendments: int = 0,
    overflow_series: int = 0,
    computed_version: int = 0,
) -> dict[str, Any]:
    """One ``window_health`` row. Shares are of the records in the window (0 when there are none)."""
    statuses = Counter(str(r.get("status")) for r in records)
    total = len(records)
    row: dict[str, Any] = {"window_start": window_start, "tenant_id": series[0], "version_id": series[1]}
    row["total"] = total
    for status in reversed(STATUS_ORDER):
        row[status] = statuses.get(status, 0)
    for status in reversed(STATUS_ORDER):
        row[f"{status}_share"] = statuses.get(status, 0) / total if total else 0.0
    row |= {
        "late_events": sum(int(r.get("late_events") or 0) for r in records),
        "late_amendments": late_amendments,
        "amendments": amendments,
        "dead_letters": dead_letters,
        "duplicate_events": sum(int(r.get("duplicate_events") or 0) for r in records),
        "overflow_series": overflow_series,
        "computed_version": computed_version,
    }
    return row


def _mix(values: Sequence[Any]) -> dict[str, int]:
    counts = Counter(UNKNOWN if v is None or v == "" else str(v) for v in values)
    return dict(sorted(counts.items()))


def llm_signals_row(
    window_start: int,
    series: Series,
    records: Sequence[Record],
    settings: Settings,
    computed_version: int = 0,
) -> dict[str, Any]:
    """One ``llm_signals`` row; rates are ``None`` when no record carried the attribute."""
    cache_known = [bool(r["prompt_cache_hit"]) for r in records if r.get("prompt_cache_hit") is not None]
    tokens = [int(r["prompt_tokens"]) for r in records if r.get("prompt_tokens") is not None]
    min_tokens = settings.windows.cacheable_min_tokens
    below = sum(1 for t in tokens if t < min_tokens)
    drafts = sorted(float(r["draft_accept_rate"]) for r in records if r.get("draft_accept_rate") is not None)
    top_k = sorted(int(r["rerank_top_k"]) for r in records if r.get("rerank_top_k") is not None)
    return {
        "window_start": window_start,
        "tenant_id": series[0],
        "version_id": series[1],
        "requests": len(records),
        "prompt_cache_known": len(cache_known),
        "prompt_cache_hits": sum(cache_known),
        "prompt_cache_hit_rate": sum(cache_known) / len(cache_known) if cache_known else None,
        "prompt_tokens_known": len(tokens),
        "below_cacheable": below,
        "below_cacheable_share": below / len(tokens) if tokens else None,
        "cacheable_min_tokens": min_tokens,
        "draft_accept_count": len(drafts),
        "draft_accept_p50": lower_quantile(drafts, 0.5),
        "draft_accept_p10": lower_quantile(drafts, 0.1),
        "route_mix": _mix([r.get("route") for r in records]),
        "fallback_mix": _mix([int(r.get("fallback_level") or 0) for r in records]),
        "recall_mode_mix": _mix([r.get("recall_mode") for r in records]),
        "rerank_top_k_count": len(top_k),
        "rerank_top_k_p50": lower_quantile(top_k, 0.5),
        "rerank_top_k_max": top_k[-1] if top_k else None,
        "computed_version": computed_version,
    }
