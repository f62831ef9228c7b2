"""Re-aggregate stored window sketches over any span: the one Python rollup of the project.

Alerting, ``ttft top``, ``ttft breakdown`` and reports merge ``stage_windows`` (or ``stage_strata``) rows
with this module; SQL does the same with ``sumMap(bins)`` and ``ttftSketchQuantile`` (docs/rollups.md,
:mod:`streams.store.sketch_sql`), and a test pins the two equal. Percentiles are never averaged: bins are
summed, then the quantile is taken once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.core.sketch import DEFAULT_RELATIVE_ACCURACY, quantile_from_bins


@dataclass(slots=True)
class SketchRollup:
    """Merged sketch of several window rows."""

    relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY
    bins: dict[int, int] = field(default_factory=dict)
    zero_count: int = 0
    count: int = 0
    max: float | None = None
    slo_bad_count: int = 0
    negative_count: int = 0
    windows: int = 0

    def add_row(self, row: Mapping[str, Any]) -> None:
        """Merge one stored row (``bins``, ``zero_count``, ``count`` and, when present, ``max`` etc.)."""
        accuracy = float(row.get("relative_accuracy", self.relative_accuracy))
        if self.windows and accuracy != self.relative_accuracy:
            raise ValueError("cannot merge sketches of different relative accuracy")
        self.relative_accuracy = accuracy
        for key, n in row["bins"].items():
            self.bins[int(key)] = self.bins.get(int(key), 0) + int(n)
        self.zero_count += int(row["zero_count"])
        self.count += int(row["count"])
        row_max = row.get("max")
        if row_max is not None and (self.max is None or float(row_max) > self.max):
            self.max = float(row_max)
        self.slo_bad_count += int(row.get("slo_bad_count") or 0)
        self.negative_count += int(row.get("negative_count") or 0)
        self.windows += 1

    def quantile(self, q: float) -> float | None:
        """Quantile of the merged sketch (``None`` when empty)."""
        return quantile_from_bins(self.bins, self.zero_count, q, self.relative_accuracy)


def rollup_rows(
    rows: Iterable[Mapping[str, Any]], group_by: Sequence[str] = ("tenant_id", "version_id", "stage")
) -> dict[tuple[Any, ...], SketchRollup]:
    """Merge rows per ``group_by`` key, e.g. one hour of ``stage_windows`` per tenant x version x stage."""
    out: dict[tuple[Any, ...], SketchRollup] = {}
    for row in rows:
        key = tuple(row[name] for name in group_by)
        rollup = out.get(key)
        if rollup is None:
            rollup = out[key] = SketchRollup(float(row.get("relative_accuracy", DEFAULT_RELATIVE_ACCURACY)))
        rollup.add_row(row)
    return out
