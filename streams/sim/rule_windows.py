"""Closed windows for the rule engine straight from a latency model: no events, no join, no store.

For sweeps over traffic rates (:mod:`streams.sim.detection`): each tenant sends ``rate`` requests/s, a share
of them to a canary version; per request, stage latencies are lognormal. A window's rows are shaped like
:mod:`streams.core.windows` output (``stage_windows`` with sketch bins, ``window_health``), so the engine
sees what it sees in production. Pure and deterministic for a seed; numpy does the sampling and binning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from streams.core.sketch import gamma_for
from streams.rules import WindowSnapshot
from streams.rules.model import Arm

WINDOW_MS = 60_000
ACCURACY = 0.01
_LOG_GAMMA = math.log(gamma_for(ACCURACY))

#: Stage -> (median ms, lognormal sigma). TTFT P95 ~1.3 s, under the shipped 2 s SLO.
STAGE_MODEL: dict[str, tuple[float, float]] = {
    "retrieval": (250.0, 0.35),
    "prompt_assemble": (60.0, 0.3),
    "llm_ttft": (600.0, 0.3),
    "other": (15.0, 0.5),
}


@dataclass(frozen=True)
class ArmTraffic:
    """One arm of one tenant in one window: expected requests and per-stage slow-down factors."""

    rate_per_s: float
    factors: Mapping[str, float]


def bins_of(values: np.ndarray) -> dict[int, int]:
    """Sketch bins of positive values, binned like ``LatencySketch.add``."""
    keys, counts = np.unique(np.ceil(np.log(values) / _LOG_GAMMA).astype(np.int64), return_counts=True)
    return dict(zip(keys.tolist(), counts.tolist(), strict=True))


class WindowSource:
    """Deterministic windows: one random stream for the whole run."""

    def __init__(self, seed: int, arms: Mapping[tuple[str, str], Arm]) -> None:
        self.rng = np.random.default_rng(seed)
        self.arms = dict(arms)

    def window(self, index: int, traffic: Mapping[tuple[str, str], ArmTraffic]) -> tuple[float, WindowSnapshot]:
        """The window ``index`` (its start, ms) with ``traffic`` per (tenant, version)."""
        ws = float(index * WINDOW_MS)
        snap = WindowSnapshot(arms=dict(self.arms))
        for (tenant, version), arm in sorted(traffic.items()):
            n = int(self.rng.poisson(arm.rate_per_s * WINDOW_MS / 1000.0))
            if n:
                self._rows(ws, tenant, version, n, arm, snap)
        return ws, snap

    def _rows(self, ws: float, tenant: str, version: str, n: int, arm: ArmTraffic, snap: WindowSnapshot) -> None:
        values: dict[str, np.ndarray] = {}
        for stage, (median, sigma) in STAGE_MODEL.items():
            factor = arm.factors.get(stage, 1.0)
            values[stage] = median * factor * np.exp(sigma * self.rng.standard_normal(n))
        values["ttft"] = sum(values.values(), np.zeros(n))
        base: dict[str, Any] = {"window_start": ws, "tenant_id": tenant, "version_id": version}
        for stage, v in values.items():
            row = {**base, "stage": stage, "count": n, "bins": bins_of(v), "zero_count": 0}
            row["relative_accuracy"] = ACCURACY
            row["slo_bad_count"] = int((v > 2_000.0).sum()) if stage == "ttft" else 0
            snap.stage_windows.append(row)
        snap.window_health.append({**base, "total": n, "complete": n, "missing_stage": 0, "timed_out": 0, "orphan": 0})
