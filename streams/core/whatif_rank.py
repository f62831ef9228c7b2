"""``ttft whatif --rank``: every stage and sub-stage by its effect on TTFT's P95 ("cut this first").

Each stage is replayed on its own (:mod:`streams.core.whatif`) 20 % faster and capped at its own P50; the
rows are sorted by the gain at 20 % faster, the same effort for every stage, so the order says which
stage moves TTFT's P95 most rather than which has the largest P95 of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from streams.core.whatif import (
    DEFAULT_RESAMPLES,
    RequestColumns,
    naive_p95,
    observed_percentiles,
    predicted_percentiles,
    replay,
)
from streams.core.whatif_levers import LEVER_STAGES, Cap, Scale
from streams.core.whatif_stats import REPORTED, lower_quantile, lower_quantiles

#: Each stage 20 % faster, and each stage capped at its own P50.
RANK_FACTOR: Final = 0.8
RANK_CAP_PERCENTILE: Final = 50.0


@dataclass(frozen=True, slots=True)
class RankRow:
    """One stage of ``--rank``: TTFT P95 with the stage 20 % faster, and with it capped at its own P50."""

    stage: str
    requests: int
    stage_p95: float
    faster_p95: float
    faster_ci: tuple[float, float]
    faster_naive_p95: float
    faster_gain: float
    cap_ms: float
    capped_p95: float
    capped_gain: float

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "requests": self.requests,
            "stage_p95": self.stage_p95,
            "faster_20": {
                "p95": self.faster_p95,
                "p95_ci": list(self.faster_ci),
                "gain": self.faster_gain,
                "naive_p95": self.faster_naive_p95,
            },
            "cap_p50": {"cap_ms": self.cap_ms, "p95": self.capped_p95, "gain": self.capped_gain},
        }


@dataclass(frozen=True, slots=True)
class Ranking:
    """``ttft whatif --rank``: every stage's effect on the TTFT P95, largest gain (20 % faster) first."""

    requests: int
    observed: dict[str, float]
    rows: tuple[RankRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "observed": dict(self.observed), "rank": [r.to_json() for r in self.rows]}


def rank_stages(columns: RequestColumns, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Ranking:
    """For each stage a request has, the TTFT P95 at 20 % faster and capped at its own P50, sorted by the
    gain at 20 % faster, then by the capped gain. Stages no request has are left out."""
    observed = observed_percentiles(columns)
    rows: list[RankRow] = []
    for index, stage in enumerate(LEVER_STAGES):
        values = columns.stages[stage]
        stage_p95 = lower_quantile(values, 0.95)
        if stage_p95 is None:
            continue
        rng = np.random.default_rng([seed, index])
        faster = replay(columns, [Scale(stage, RANK_FACTOR)])
        faster_summary, ci = predicted_percentiles(faster, resamples, rng)
        capped = replay(columns, [Cap(stage, percentile=RANK_CAP_PERCENTILE)])
        capped_p95 = float(lower_quantiles(capped.predicted, [REPORTED["p95"]])[0])
        rows.append(
            RankRow(
                stage=stage,
                requests=int(np.count_nonzero(~np.isnan(values))),
                stage_p95=stage_p95,
                faster_p95=faster_summary["p95"],
                faster_ci=ci,
                faster_naive_p95=naive_p95(observed["p95"], faster),
                faster_gain=observed["p95"] - faster_summary["p95"],
                cap_ms=float(capped.levers[0].detail["cap_ms"]),
                capped_p95=capped_p95,
                capped_gain=observed["p95"] - capped_p95,
            )
        )
    rows.sort(key=lambda r: (-r.faster_gain, -r.capped_gain, LEVER_STAGES.index(r.stage)))
    return Ranking(columns.n, observed, tuple(rows))
