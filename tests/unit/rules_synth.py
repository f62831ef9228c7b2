"""Synthetic closed windows for the rule tests: rows shaped like streams.core.windows output.

One fixed traffic rate for every test (``RATE`` requests per arm, tenant and window), chosen to meet the
sample gates of the default rules. Latencies are lognormal per stage and prompt-cache stratum; sketches are
LatencySketch bins (numpy does the binning with the same formula as ``LatencySketch.add``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streams.core.sketch import LatencySketch, gamma_for
from streams.rules import RuleEngine, RulesConfig, WindowSnapshot
from streams.rules.model import Arm
from streams.settings import Settings

RATE = 1_000
W_MS = 60_000
ACCURACY = 0.01
_LOG_GAMMA = math.log(gamma_for(ACCURACY))
STAGES = (
    "retrieval",
    "vector_recall",
    "bm25_recall",
    "rerank",
    "prompt_assemble",
    "llm_ttft",
    "other",
    "ttft",
)


@dataclass(frozen=True)
class Traffic:
    """One arm's traffic in one window."""

    n: int = RATE
    retrieval_factor: float = 1.0
    llm_factor: float = 1.0
    miss_share: float = 0.3
    draft_p50: float | None = 0.78
    complete_share: float = 1.0


@dataclass
class Scenario:
    """Tenants -> versions -> traffic, the arms of the versions, and a deterministic random stream."""

    seed: int = 7
    arms: dict[tuple[str, str], Arm] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def window(self, index: int, traffic: dict[str, dict[str, Traffic]]) -> tuple[float, WindowSnapshot]:
        ws = float(index * W_MS)
        snap = WindowSnapshot(arms=dict(self.arms))
        for tenant, versions in sorted(traffic.items()):
            for version, t in sorted(versions.items()):
                self._arm(ws, tenant, version, t, snap)
        return ws, snap

    def _arm(self, ws: float, tenant: str, version: str, t: Traffic, snap: WindowSnapshot) -> None:
        rng = self.rng
        miss = rng.random(t.n) < t.miss_share

        def logn(median: float, sigma: float) -> np.ndarray:
            return median * np.exp(sigma * rng.standard_normal(t.n))

        vec, bm25, rerank = logn(120, 0.3), logn(80, 0.3), logn(100, 0.3)
        retrieval = (np.maximum(vec, bm25) + rerank) * t.retrieval_factor
        assemble = np.where(miss, logn(110, 0.3), logn(60, 0.3))
        llm = np.where(miss, logn(1300, 0.3), logn(700, 0.3)) * t.llm_factor
        other = logn(15, 0.5)
        values = {
            "retrieval": retrieval,
            "vector_recall": vec * t.retrieval_factor,
            "bm25_recall": bm25 * t.retrieval_factor,
            "rerank": rerank * t.retrieval_factor,
            "prompt_assemble": assemble,
            "llm_ttft": llm,
            "other": other,
            "ttft": retrieval + assemble + llm + other,
        }
        base = {"window_start": ws, "tenant_id": tenant, "version_id": version}
        for stage in STAGES:
            sk = sketch(values[stage])
            row: dict[str, Any] = {**base, "stage": stage, "count": sk.count, "p95": sk.quantile(0.95)}
            row |= {"bins": sk.bins, "zero_count": 0, "relative_accuracy": ACCURACY}
            # As streams.core.windows: SLO-bad = over the SLO, plus every timed-out and orphaned request.
            slo_bad = int((values["ttft"] > 5_000).sum()) + t.n - round(t.n * t.complete_share)
            row["slo_bad_count"] = slo_bad if stage == "ttft" else 0
            snap.stage_windows.append(row)
            for cache, mask in (("hit", ~miss), ("miss", miss)):
                if mask.any():
                    part = sketch(values[stage][mask])
                    snap.stage_strata.append(
                        {
                            **base,
                            "stage": stage,
                            "route": "main",
                            "prompt_cache": cache,
                            "prompt_bucket": "1k-4k",
                        }
                        | {"count": part.count, "bins": part.bins, "zero_count": 0}
                    )
        complete = round(t.n * t.complete_share)
        snap.window_health.append(
            {**base, "total": t.n, "complete": complete, "missing_stage": 0, "timed_out": t.n - complete}
            | {"orphan": 0}
        )
        if t.draft_p50 is not None:
            snap.llm_signals.append(
                {**base, "draft_accept_p50": t.draft_p50, "draft_accept_p10": t.draft_p50 - 0.2}
                | {"draft_accept_count": t.n}
            )


def sketch(values: np.ndarray) -> LatencySketch:
    """A LatencySketch of positive values, binned like LatencySketch.add."""
    keys, counts = np.unique(np.ceil(np.log(values) / _LOG_GAMMA).astype(int), return_counts=True)
    sk = LatencySketch(ACCURACY, dict(zip(keys.tolist(), counts.tolist(), strict=True)))
    sk.count = int(counts.sum())
    return sk


def make_settings(**overrides: Any) -> Settings:
    return Settings(default_slo_ms=5_000.0, **overrides)


def make_engine(config: RulesConfig | None = None, **overrides: Any) -> RuleEngine:
    return RuleEngine(config or RulesConfig(), make_settings(**overrides))
