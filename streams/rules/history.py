"""Bounded per-series history of closed windows, and sketch merging over a span of windows.

Windows arrive in event-time order (one evaluation per window close), so each series is a deque in
window order, trimmed to the longest span a rule needs. P95s over a span always come from merged bins,
never from per-window percentiles.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from streams.core.sketch import LatencySketch, merge_bins

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WindowHistory(Generic[K, V]):
    """Per key, the values of the last ``keep_windows`` windows (by window start, gaps allowed)."""

    def __init__(self, window_ms: float, keep_windows: int) -> None:
        self._window_ms = window_ms
        self._keep_windows = keep_windows
        self._series: dict[K, deque[tuple[float, V]]] = {}

    def add(self, key: K, window_start: float, value: V) -> None:
        """Record ``value`` for a window; a window at or before the newest one of the series is ignored."""
        series = self._series.setdefault(key, deque())
        if series and window_start <= series[-1][0]:
            return
        series.append((window_start, value))

    def span(self, key: K, first: float, last: float) -> list[V]:
        """Values of windows with ``first <= window_start <= last``, oldest first."""
        series = self._series.get(key)
        if not series:
            return []
        return [v for ws, v in series if first <= ws <= last]

    def items(self, key: K, first: float, last: float) -> list[tuple[float, V]]:
        """``(window_start, value)`` of windows with ``first <= window_start <= last``, oldest first."""
        series = self._series.get(key)
        if not series:
            return []
        return [(ws, v) for ws, v in series if first <= ws <= last]

    def recent(self, key: K, now: float, windows: int) -> list[V]:
        """Values of the ``windows`` windows ending with the one starting at ``now``."""
        return self.span(key, now - (windows - 1) * self._window_ms, now)

    def newer_than(self, key: K, after: float, last: float) -> list[tuple[float, V]]:
        """Windows with ``after < window_start <= last``, oldest first (scans from the newest end)."""
        series = self._series.get(key)
        if not series:
            return []
        out: list[tuple[float, V]] = []
        for ws, v in reversed(series):
            if ws <= after:
                break
            if ws <= last:
                out.append((ws, v))
        out.reverse()
        return out

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def first_seen(self, key: K) -> float | None:
        series = self._series.get(key)
        return series[0][0] if series else None

    def keys(self) -> Iterator[K]:
        return iter(list(self._series))

    def prune(self, now: float) -> None:
        """Drop windows older than the kept span, and series left empty."""
        oldest = now - (self._keep_windows - 1) * self._window_ms
        for key in list(self._series):
            series = self._series[key]
            while series and series[0][0] < oldest:
                series.popleft()
            if not series:
                del self._series[key]


def sketch_of_row(row: Mapping[str, Any], relative_accuracy: float) -> LatencySketch:
    """The sketch of a ``stage_windows``/``stage_strata`` row (bins + zero_count)."""
    return LatencySketch.from_bins(
        row.get("bins") or {}, int(row.get("zero_count") or 0), relative_accuracy=relative_accuracy
    )


def sketch_over(bins: dict[int, int], zero_count: int, relative_accuracy: float) -> LatencySketch:
    """A sketch wrapping ``bins`` without copying (callers only read it)."""
    sketch = LatencySketch(relative_accuracy, bins, zero_count)
    sketch.count = zero_count + sum(bins.values())
    return sketch


def merge_sketches(parts: Iterable[LatencySketch], relative_accuracy: float) -> LatencySketch:
    """One sketch of several (bins summed): the only way a P95 over a span is computed."""
    items = list(parts)
    if len(items) == 1:
        return items[0]
    return sketch_over(merge_bins(p.bins for p in items), sum(p.zero_count for p in items), relative_accuracy)


class RollingSum:
    """A running bin sum over a sliding range of windows: each window is added once and removed once,
    so a 60-window baseline costs two bin-map updates per evaluation instead of a 60-way merge."""

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.zero_count = 0
        self._members: deque[tuple[float, LatencySketch]] = deque()
        self._last_added = float("-inf")

    def advance(self, entering: Iterable[tuple[float, LatencySketch | None]], first: float) -> None:
        """Add the windows entering the range (``None``: skip it), then drop those before ``first``."""
        for ws, sketch in entering:
            self._last_added = max(self._last_added, ws)
            if sketch is None or ws < first:
                continue
            self._members.append((ws, sketch))
            self.zero_count += sketch.zero_count
            for k, n in sketch.bins.items():
                self.bins[k] = self.bins.get(k, 0) + n
        while self._members and self._members[0][0] < first:
            _, old = self._members.popleft()
            self._subtract(old)

    def retreat(self, last: float) -> None:
        """Drop the windows after ``last`` (the range's end moved back, e.g. a span grew); they are
        added again by a later :meth:`advance` once the range reaches them."""
        if self._last_added <= last:
            return
        while self._members and self._members[-1][0] > last:
            _, old = self._members.pop()
            self._subtract(old)
        self._last_added = last

    def _subtract(self, old: LatencySketch) -> None:
        self.zero_count -= old.zero_count
        for k, n in old.bins.items():
            left = self.bins[k] - n
            if left:
                self.bins[k] = left
            else:
                del self.bins[k]

    @property
    def last_added(self) -> float:
        return self._last_added

    def sketch(self, relative_accuracy: float) -> LatencySketch:
        """The current sum as a read-only sketch view."""
        return sketch_over(self.bins, self.zero_count, relative_accuracy)
