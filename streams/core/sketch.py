"""The one latency sketch format of the project: DDSketch-style logarithmic bins.

A value ``x > 0`` goes to bin ``k = ceil(log(x) / log(gamma))`` with ``gamma = (1 + a) / (1 - a)`` for a
relative accuracy ``a``; zeros (and values below :data:`MIN_VALUE`) go to a separate zero count. Bins are
plain ``{int: int}`` counts, stored in ClickHouse as ``Map(Int32, UInt64)`` plus ``zero_count UInt64``,
so SQL merges them with ``sumMap`` and Python adds dicts.

The quantile follows numpy's ``quantile(x, q, method='lower')`` rank: the element at sorted index
``floor(q * (n - 1))``. The sketch returns the representative value of that element's bin,
``2 * gamma**k / (gamma + 1)``, which is within ``a`` of the exact value. The same function exists once
in SQL (:mod:`streams.store.sketch_sql`), and a test pins the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

DEFAULT_RELATIVE_ACCURACY: Final = 0.01
#: Values at or below this (ms) count as zero: a microsecond-scale stage is "free" for TTFT purposes.
MIN_VALUE: Final = 1e-3


def gamma_for(relative_accuracy: float) -> float:
    """The bin growth factor for a relative accuracy."""
    return (1.0 + relative_accuracy) / (1.0 - relative_accuracy)


def bin_key(value: float, log_gamma: float) -> int:
    """Bin index of a positive value."""
    return math.ceil(math.log(value) / log_gamma)


def bin_value(key: int, gamma: float) -> float:
    """Representative value of a bin: within the relative accuracy of everything in it.

    gamma**key by squaring with IEEE multiplications only: libm pow() implementations differ in the last
    bit (ClickHouse's from glibc's for ~3.5 % of keys), and the SQL twin must match bit for bit.
    """
    acc, power, n = 1.0, gamma, abs(key)
    while n:
        if n & 1:
            acc *= power
        power *= power
        n >>= 1
    return 2.0 * (acc if key >= 0 else 1.0 / acc) / (gamma + 1.0)


def rank_lower(q: float, n: int) -> int:
    """numpy ``method='lower'`` index of quantile ``q`` among ``n`` sorted values."""
    return math.floor(q * (n - 1))


def quantile_from_bins(
    bins: Mapping[int, int],
    zero_count: int,
    q: float,
    relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
) -> float | None:
    """Quantile ``q`` of a sketch given as bins; ``None`` when empty. Shared by alerting, top and reports."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be within [0, 1]")
    n = zero_count + sum(bins.values())
    if n == 0:
        return None
    rank = rank_lower(q, n)
    if rank < zero_count:
        return 0.0
    seen = zero_count
    for key in sorted(bins):
        seen += bins[key]
        if seen > rank:
            return bin_value(key, gamma_for(relative_accuracy))
    raise AssertionError("unreachable: ranks exhausted")  # pragma: no cover


@dataclass(slots=True)
class LatencySketch:
    """A mergeable latency sketch (milliseconds). Exact count and max; quantiles within the accuracy."""

    relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY
    bins: dict[int, int] = field(default_factory=dict)
    zero_count: int = 0
    count: int = 0
    max: float | None = None
    _log_gamma: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._log_gamma = math.log(gamma_for(self.relative_accuracy))

    @classmethod
    def of(cls, values: Iterable[float], relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> LatencySketch:
        sketch = cls(relative_accuracy)
        for v in values:
            sketch.add(v)
        return sketch

    @classmethod
    def from_bins(
        cls,
        bins: Mapping[int, int],
        zero_count: int,
        max_value: float | None = None,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
    ) -> LatencySketch:
        sketch = cls(relative_accuracy, {int(k): int(v) for k, v in bins.items() if v}, int(zero_count))
        sketch.count = sketch.zero_count + sum(sketch.bins.values())
        sketch.max = max_value
        return sketch

    def add(self, value: float) -> None:
        """Add one non-negative finite value."""
        if not value >= 0.0 or math.isinf(value):
            raise ValueError(f"sketch values must be finite and >= 0, got {value!r}")
        self.count += 1
        if self.max is None or value > self.max:
            self.max = value
        if value <= MIN_VALUE:
            self.zero_count += 1
            return
        key = math.ceil(math.log(value) / self._log_gamma)
        self.bins[key] = self.bins.get(key, 0) + 1

    def merge(self, other: LatencySketch) -> None:
        """Add another sketch of the same accuracy into this one."""
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError("cannot merge sketches of different relative accuracy")
        for key, n in other.bins.items():
            self.bins[key] = self.bins.get(key, 0) + n
        self.zero_count += other.zero_count
        self.count += other.count
        if other.max is not None and (self.max is None or other.max > self.max):
            self.max = other.max

    def quantile(self, q: float) -> float | None:
        return quantile_from_bins(self.bins, self.zero_count, q, self.relative_accuracy)

    def share_above(self, threshold: float) -> float:
        """Fraction of values whose bin lies wholly above ``threshold`` (for tail tests and SLOs)."""
        if self.count == 0:
            return 0.0
        gamma = gamma_for(self.relative_accuracy)
        above = sum(n for k, n in self.bins.items() if bin_value(k, gamma) > threshold)
        return above / self.count


def merge_bins(parts: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """Sum several bin maps (Python's ``sumMap``)."""
    out: dict[int, int] = {}
    for part in parts:
        for key, n in part.items():
            out[key] = out.get(key, 0) + n
    return out
