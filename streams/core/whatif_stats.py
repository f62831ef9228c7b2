"""Exact percentiles and their bootstrap interval over numpy arrays, for ``ttft whatif``.

The percentile is the store's exact one (docs/design.md, windows): numpy ``quantile(x, q, method='lower')``,
the element at sorted index ``floor(q * (n - 1))``, the same rank the sketches use
(:func:`streams.core.sketch.rank_lower`). ClickHouse's ``quantile*`` functions are never used.

The bootstrap interval of a percentile is computed without materialising the resamples. A resample of
``n`` requests draws ``n`` sorted indices ``I_i = floor(n * U_i)`` with ``U_i`` uniform on [0, 1); the
resample's ``k``-th smallest value is ``sorted[I_(k)]`` (the values are sorted, so order statistics map
through), and ``I_(k) = floor(n * U_(k))`` where ``U_(k)``, the ``(k+1)``-th smallest of ``n``
uniforms, is ``Beta(k + 1, n - k)``. One beta draw per resample therefore gives exactly the distribution
of "resample the requests with replacement, take the percentile of their predicted TTFT": 200 resamples
of 1M requests cost one sort instead of 200 draws of a million indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from streams.core.sketch import rank_lower

FloatArray = npt.NDArray[np.float64]

#: The percentiles ``ttft whatif`` reports, by name.
REPORTED: Final[dict[str, float]] = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
CI_LEVEL: Final = 0.95


def lower_quantiles(values: FloatArray, qs: Sequence[float]) -> list[float]:
    """numpy ``quantile(values, q, method='lower')`` for each ``q`` (one partial sort); ``values`` non-empty
    and free of NaN."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    ranks = [rank_lower(q, n) for q in qs]
    parted = np.partition(values, sorted(set(ranks)))
    return [float(parted[r]) for r in ranks]


def lower_quantile(values: FloatArray, q: float) -> float | None:
    """:func:`lower_quantiles` of one ``q`` over the present (non-NaN) values; ``None`` when there are none."""
    present = values[~np.isnan(values)]
    return lower_quantiles(present, [q])[0] if len(present) else None


def bootstrap_interval(
    sorted_values: FloatArray, q: float, resamples: int, rng: np.random.Generator, level: float = CI_LEVEL
) -> tuple[float, float]:
    """The ``level`` percentile-bootstrap interval of the ``q`` quantile of ``sorted_values`` (ascending).

    Exactly the distribution of resampling the values with replacement (module docstring). The interval's
    ends are the resampled quantiles' ``(1 - level) / 2`` order statistic rounded down and their
    ``(1 + level) / 2`` one rounded up, so the two ends leave as many resamples out (4 of 200 each).
    """
    n = len(sorted_values)
    if n == 0 or resamples < 1:
        raise ValueError("a bootstrap needs values and at least one resample")
    k = rank_lower(q, n)
    u = rng.beta(k + 1, n - k, size=resamples)
    index = np.minimum((u * n).astype(np.int64), n - 1)
    replicates = np.sort(sorted_values[index])
    tail = (1.0 - level) / 2.0
    lo = replicates[math.floor(tail * (resamples - 1))]
    hi = replicates[math.ceil((1.0 - tail) * (resamples - 1))]
    return float(lo), float(hi)
