"""All aggregate rows of one closed event-time window, computed from that window's request records.

The writer reads a window's records from ``requests FINAL`` when the window closes (watermark +
``windows.grace_s``) and again after a late record amends it, calls :func:`aggregate_window`, and inserts
the rows into ReplacingMergeTree tables keyed by the window key. The function is pure and deterministic:
the same records give the same rows (same keys, counts and bins) in any order, on any worker, after any
restart, so a recompute replaces rows instead of adding to them, and a replay or a crash never
double-counts.

Row shapes (plain dicts, the column names of migration ``0003_aggregates.sql``; ``window_start`` is epoch
milliseconds, bins are ``{int: int}``):

- ``stage_windows``: window x tenant x version x stage (parents, sub-stages, ``other``, custom stages,
  ``ttft``), with count, p50/p90/p95/p99 from the sketch, exact max, bins, zero_count, ``slo_bad_count``
  (``ttft`` only) and ``negative_count`` (values below 0, clamped to 0 in the sketch).
- ``stage_strata``: the same per route x prompt-cache state x prompt-length bucket (count and bins).
- ``tail_attribution``, ``window_health``, ``llm_signals``: see :mod:`streams.core.attribution` and
  :mod:`streams.core.health`.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from streams.core.attribution import tail_attribution_row
from streams.core.health import (
    SeriesCounts,
    llm_signals_row,
    record_series,
    resolve_counts,
    series_key,
    window_health_row,
)
from streams.core.series import Series, SeriesAdmission, SeriesAssignment
from streams.core.sketch import MIN_VALUE, gamma_for, quantile_from_bins
from streams.core.stages import (
    RESERVED_STAGE_NAMES,
    TTFT,
    Record,
    cache_state,
    is_sketched,
    is_slo_bad,
    prompt_bucket,
    route_of,
    stage_samples,
)
from streams.core.tenancy import SteadyLedger
from streams.settings import Settings

Row = dict[str, Any]
QUANTILES: Final = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))


@dataclass(slots=True)
class WindowAggregates:
    """Every row one window produces, per table, in a deterministic order."""

    stage_windows: list[Row] = field(default_factory=list)
    stage_strata: list[Row] = field(default_factory=list)
    tail_attribution: list[Row] = field(default_factory=list)
    window_health: list[Row] = field(default_factory=list)
    llm_signals: list[Row] = field(default_factory=list)
    #: Distinct tenant x version series folded into ``__other__`` in this window (cap tripped if > 0).
    overflow_series: int = 0
    #: Distinct (tenant, custom stage) and (tenant, route) pairs folded into ``__other__`` (per-tenant caps).
    folded_custom_stages: int = 0
    folded_routes: int = 0


#: Where a tenant's custom stages and routes past its caps go (not a valid stage name: never a producer's).
FOLDED: str = "__other__"


@dataclass(frozen=True, slots=True)
class DimensionCaps:
    """Per tenant, the custom stages and routes kept in one window; the rest fold into ``__other__``.

    Deterministic like the series caps: ranked by a hash of ``tenant\\0name``, never by arrival."""

    stages: Mapping[str, frozenset[str]]
    routes: Mapping[str, frozenset[str]]
    folded_stages: int = 0
    folded_routes: int = 0

    def stage(self, tenant: str, stage: str) -> str:
        kept = self.stages.get(tenant)
        return stage if kept is None or stage in kept else FOLDED

    def route(self, tenant: str, route: str) -> str:
        kept = self.routes.get(tenant)
        return route if kept is None or route in kept else FOLDED


def dimension_caps(records: Sequence[Record], settings: Settings) -> DimensionCaps:
    """The per-tenant custom-stage and route caps of one window (``windows.max_custom_stages_per_tenant``,
    ``windows.max_routes_per_tenant``)."""
    customs: dict[str, set[str]] = defaultdict(set)
    routes: dict[str, set[str]] = defaultdict(set)
    for r in records:
        tenant = str(r["tenant_id"])
        customs[tenant].update(r.get("custom_stages") or ())
        routes[tenant].add(route_of(r))
    w = settings.windows
    kept_stages, folded_stages = _keep_ranked(customs, w.max_custom_stages_per_tenant)
    kept_routes, folded_routes = _keep_ranked(routes, w.max_routes_per_tenant)
    return DimensionCaps(kept_stages, kept_routes, folded_stages, folded_routes)


def _keep_ranked(names: Mapping[str, set[str]], cap: int) -> tuple[dict[str, frozenset[str]], int]:
    kept: dict[str, frozenset[str]] = {}
    folded = 0
    for tenant, present in names.items():
        if len(present) <= cap:
            continue  # no entry: everything kept
        ranked = sorted(present, key=lambda n: (hashlib.blake2b(f"{tenant}\0{n}".encode(), digest_size=8).digest(), n))
        kept[tenant] = frozenset(ranked[:cap])
        folded += len(ranked) - cap
    return kept, folded


def default_computed_version(records: Sequence[Record]) -> int:
    """Row version of one series: the sum of its records' versions.

    Records only gain events (their versions only grow) and late records only add to a window, so a
    recompute that saw more wins in the ReplacingMergeTree, and a replay computes the same version. On a
    tie (e.g. only a dead-letter count changed) ReplacingMergeTree keeps the last inserted row, which is
    the latest computation. Summed over a window's ``window_health`` rows it equals ``sum(record_version)``
    of the window's records, which the writer uses to spot stale windows after a restart.
    """
    return sum(int(r.get("record_version", 0)) for r in records)


def aggregate_window(
    records: Sequence[Record],
    window_start_ms: float,
    settings: Settings,
    *,
    admission: SeriesAdmission | None = None,
    pinned_series: Iterable[Series] = (),
    late_amendments: SeriesCounts | None = None,
    dead_letters: SeriesCounts | None = None,
    amendments: int = 0,
    computed_version: int | None = None,
) -> WindowAggregates:
    """Compute every aggregate row of one window from all of its request records (all tenants/versions).

    ``late_amendments`` and ``dead_letters`` are counts keyed by ``(tenant, version)`` or by tenant
    alone (then booked on version ``unknown``). ``amendments`` is how often this window was recomputed
    after it closed. ``pinned_series`` are the series already stored for the window (series cap rule in
    :mod:`streams.core.series`). ``computed_version`` overrides :func:`default_computed_version`.
    """
    window_start = int(window_start_ms)
    admission = admission or SeriesAdmission.from_settings(settings)
    late = late_amendments or {}
    dead = dead_letters or {}
    present = {record_series(r) for r in records}
    present |= {series_key(k) for k in (*late.keys(), *dead.keys())}
    assignment = admission.assign(present, pinned_series)

    groups: dict[Series, list[Record]] = defaultdict(list)
    for record in records:
        groups[assignment.resolve(*record_series(record))].append(record)
    late_by_series = resolve_counts(late, assignment)
    dead_by_series = resolve_counts(dead, assignment)
    for series in (*late_by_series, *dead_by_series):
        groups.setdefault(series, [])

    caps = dimension_caps(records, settings)
    out = WindowAggregates(
        overflow_series=assignment.overflow_series,
        folded_custom_stages=caps.folded_stages,
        folded_routes=caps.folded_routes,
    )
    for series in sorted(groups):
        group = groups[series]
        version = default_computed_version(group) if computed_version is None else computed_version
        stage_rows, strata_rows = _stage_rows(window_start, series, group, settings, version, caps)
        out.stage_windows.extend(stage_rows)
        out.stage_strata.extend(strata_rows)
        out.tail_attribution.append(tail_attribution_row(window_start, series, group, version))
        out.window_health.append(
            window_health_row(
                window_start,
                series,
                group,
                late_amendments=late_by_series.get(series, 0),
                dead_letters=dead_by_series.get(series, 0),
                amendments=amendments,
                overflow_series=_overflow_for(series, assignment),
                computed_version=version,
            )
        )
        out.llm_signals.append(llm_signals_row(window_start, series, group, settings, version))
    return out


def _overflow_for(series: Series, assignment: SeriesAssignment) -> int:
    return assignment.overflow_into(series)


def _stage_rows(
    window_start: int,
    series: Series,
    records: Sequence[Record],
    settings: Settings,
    computed_version: int,
    caps: DimensionCaps | None = None,
) -> tuple[list[Row], list[Row]]:
    """stage_windows and stage_strata rows of one series (custom stages and routes past the per-tenant
    caps folded into ``__other__``)."""
    accuracy = settings.windows.relative_accuracy
    log_gamma = math.log(gamma_for(accuracy))
    slo_ms = {tenant: settings.slo_ms(tenant) for tenant in {str(r["tenant_id"]) for r in records}}
    slo_bad = sum(1 for r in records if is_slo_bad(r, slo_ms[str(r["tenant_id"])]))
    sketched = [r for r in records if is_sketched(r)]
    caps = caps or DimensionCaps({}, {})
    cells = [(caps.route(str(r["tenant_id"]), route_of(r)), cache_state(r), prompt_bucket(r)) for r in sketched]
    samples = _fold_stages(stage_samples(sketched), caps, series[0])
    if records and TTFT not in samples:
        # A ttft row even without latencies: it carries the SLO-bad count of an outage window.
        samples[TTFT] = []
    base = {"window_start": window_start, "tenant_id": series[0], "version_id": series[1]}
    stage_rows: list[Row] = []
    strata_rows: list[Row] = []
    for stage, pairs in samples.items():
        values = [v if v > 0.0 else 0.0 for _, v in pairs]
        # Bin keys exactly as LatencySketch.add computes them (math.log), so every path bins alike.
        keys = [math.ceil(math.log(v) / log_gamma) if v > MIN_VALUE else None for v in values]
        bins, zero_count = _bin_counts(keys)
        row: Row = {**base, "stage": stage, "count": len(keys)}
        for name, q in QUANTILES:
            row[name] = quantile_from_bins(bins, zero_count, q, accuracy)
        row |= {
            "max": max(values) if values else None,
            "bins": bins,
            "zero_count": zero_count,
            "slo_bad_count": slo_bad if stage == TTFT else 0,
            "negative_count": sum(1 for _, v in pairs if v < 0.0),
            "relative_accuracy": accuracy,
            "computed_version": computed_version,
        }
        stage_rows.append(row)
        by_cell: dict[tuple[str, str, str], list[int | None]] = defaultdict(list)
        for (index, _), key in zip(pairs, keys, strict=True):
            by_cell[cells[index]].append(key)
        for (route, cache, bucket), cell_keys in sorted(by_cell.items()):
            cell_bins, cell_zeros = _bin_counts(cell_keys)
            strata_rows.append(
                {
                    **base,
                    "stage": stage,
                    "route": route,
                    "prompt_cache": cache,
                    "prompt_bucket": bucket,
                    "count": len(cell_keys),
                    "bins": cell_bins,
                    "zero_count": cell_zeros,
                    "relative_accuracy": accuracy,
                    "computed_version": computed_version,
                }
            )
    return stage_rows, strata_rows


def _fold_stages(
    samples: dict[str, list[tuple[int, float]]], caps: DimensionCaps, tenant: str
) -> dict[str, list[tuple[int, float]]]:
    """Custom stages past the tenant's cap merged into one ``__other__`` stage (known stages never fold)."""
    if tenant not in caps.stages:
        return samples
    out: dict[str, list[tuple[int, float]]] = {}
    for stage, pairs in samples.items():
        name = stage if stage in RESERVED_STAGE_NAMES else caps.stage(tenant, stage)
        out.setdefault(name, []).extend(pairs)
    return out


def _bin_counts(keys: list[int | None]) -> tuple[dict[int, int], int]:
    counts = Counter(keys)
    zero_count = counts.pop(None, 0)
    return {k: counts[k] for k in sorted(k for k in counts if k is not None)}, zero_count


def aggregate_windows(records: Iterable[Record], settings: Settings, **kwargs: Any) -> dict[int, WindowAggregates]:
    """Convenience for replays and tests: group records by ``window_start`` and aggregate each window, in
    order. Without an ``admission``, the registered tenants are the writer's (:class:`SteadyLedger`: the
    configured ones plus those promoted by the windows aggregated so far)."""
    by_window: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        by_window[int(record["window_start"])].append(record)
    if kwargs.get("admission") is not None:
        return {ws: aggregate_window(rs, ws, settings, **kwargs) for ws, rs in sorted(by_window.items())}
    ledger = SteadyLedger.from_settings(settings)
    admission = SeriesAdmission.from_settings(settings)
    window_ms = settings.windows.window_s * 1000
    out: dict[int, WindowAggregates] = {}
    for ws, rs in sorted(by_window.items()):
        if ledger.observe(ws // window_ms, {str(r["tenant_id"]) for r in rs}):
            admission = replace(admission, registered=ledger.registered)
        out[ws] = aggregate_window(rs, ws, settings, **{**kwargs, "admission": admission})
    return out


__all__ = ["QUANTILES", "Row", "WindowAggregates", "aggregate_window", "aggregate_windows"]
