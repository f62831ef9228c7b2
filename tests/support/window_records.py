"""Synthetic joined request records (the dicts the join emits) with lognormal, correlated stage latencies.

Built directly as records, no Kafka: the ground truth for the window aggregates is numpy over the same
values. Stages of one request share a latent "load" factor, so a slow request tends to be slow in every
stage (as in production, where one overloaded node or a long prompt slows several stages at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from schemas.records import record_version
from tests.support.recent import RECENT_DAY_MS

HOUR_START_MS = RECENT_DAY_MS  # a window and hour boundary inside the retention TTLs
WINDOW_MS = 60_000
TENANTS = ("acme", "globex", "bücher-ü")
VERSIONS = ("v1", "v2")


def synthetic_records(
    n: int,
    *,
    seed: int = 3,
    start_ms: int = HOUR_START_MS,
    span_ms: int = 3_600_000,
    tenants: Sequence[str] = TENANTS,
    versions: Sequence[str] = VERSIONS,
    correlation: float = 0.6,
    llm_median_ms: float = 900.0,
    retrieval_median_ms: float = 300.0,
    assemble_median_ms: float = 120.0,
    status_shares: tuple[float, float, float] = (0.02, 0.01, 0.01),
) -> list[dict[str, Any]]:
    """``n`` records spread over ``span_ms``; ``status_shares``: (missing_stage, timed_out, orphan)."""
    rng = np.random.default_rng(seed)
    load = rng.standard_normal(n)

    def stage(median: float, sigma: float) -> np.ndarray:
        own = rng.standard_normal(n)
        z = np.sqrt(correlation) * load + np.sqrt(1.0 - correlation) * own
        values: np.ndarray = median * np.exp(sigma * z)
        return values

    tenant_idx = rng.integers(0, len(tenants), n)
    version_idx = rng.integers(0, len(versions), n)
    vector = stage(retrieval_median_ms * 0.6, 0.5)
    bm25 = stage(retrieval_median_ms * 0.4, 0.6)
    rerank = stage(retrieval_median_ms * 0.3, 0.4)
    retrieval = np.maximum(vector, bm25) + rerank
    assemble = stage(assemble_median_ms, 0.5)
    # v2 is the faster model: its LLM first token is 30 % quicker.
    llm = stage(llm_median_ms, 0.45) * np.where(version_idx == 1, 0.7, 1.0)
    gap = stage(15.0, 0.8)
    negative = rng.random(n) < 0.02
    gap = np.where(negative, -rng.uniform(0.0, 5.0, n), gap)
    started = start_ms + rng.uniform(0.0, span_ms, n)
    status_draw = rng.random(n)
    missing_cut, timeout_cut, orphan_cut = np.cumsum(status_shares)
    tokens = np.round(np.exp(rng.normal(7.5, 1.2, n))).astype(int)
    cache = rng.random(n)
    draft = rng.beta(6, 3, n)
    top_k = rng.integers(5, 50, n)
    custom = rng.random(n) < 0.3
    guard = stage(8.0, 0.3)
    routes = np.where(rng.random(n) < 0.25, "fast", "main")

    # Plain Python scalars: indexing numpy arrays per element is ~10x slower than lists.
    (vector_l, bm25_l, rerank_l, retrieval_l, assemble_l, llm_l, gap_l, started_l, draw_l) = (
        a.tolist() for a in (vector, bm25, rerank, retrieval, assemble, llm, gap, started, status_draw)
    )
    tenant_l, version_l, tokens_l, cache_l = (
        tenant_idx.tolist(),
        version_idx.tolist(),
        tokens.tolist(),
        cache.tolist(),
    )
    draft_l, top_k_l, custom_l, guard_l, routes_l = (
        draft.tolist(),
        top_k.tolist(),
        custom.tolist(),
        guard.tolist(),
        routes.tolist(),
    )
    out: list[dict[str, Any]] = []
    for i in range(n):
        status = "complete"
        if draw_l[i] < missing_cut:
            status = "missing_stage"
        elif draw_l[i] < timeout_cut:
            status = "timed_out"
        elif draw_l[i] < orphan_cut:
            status = "orphan"
        ttft = float(retrieval_l[i] + assemble_l[i] + llm_l[i] + gap_l[i])
        record: dict[str, Any] = {
            "request_id": f"req-{seed}-{i:07d}",
            "tenant_id": tenants[tenant_l[i]],
            "version_id": versions[version_l[i]],
            "rollout": None,
            "route": str(routes_l[i]),
            "fallback_level": int(i % 17 == 0),
            "status": status,
            "missing_stages": [],
            "started_at": float(started_l[i]),
            "first_token_at": float(started_l[i]) + ttft,
            "window_start": float(int(started_l[i] // WINDOW_MS) * WINDOW_MS),
            "ttft_ms": ttft,
            "retrieval_ms": float(retrieval_l[i]),
            "vector_recall_ms": float(vector_l[i]),
            "bm25_recall_ms": float(bm25_l[i]),
            "rerank_ms": float(rerank_l[i]),
            "prompt_assemble_ms": float(assemble_l[i]),
            "llm_ttft_ms": float(llm_l[i]),
            "other_ms": float(gap_l[i]),
            "custom_stages": {"guardrail": float(guard_l[i])} if custom_l[i] else {},
            "stage_repeats": {},
            "recall_mode": "parallel",
            "prompt_tokens": int(tokens_l[i]) if i % 11 else None,
            "cached_tokens": None,
            "prompt_cache_hit": None if i % 13 == 0 else bool(cache_l[i] < 0.4),
            "draft_accept_rate": float(draft_l[i]) if i % 3 else None,
            "rerank_top_k": int(top_k_l[i]),
            "retrieval_cache_hit": None,
            "trace_id": None,
            "duplicate_events": 0,
            "late_events": int(i % 97 == 0),
            "event_count": 8,
            "amend": False,
        }
        if status == "missing_stage":
            record["missing_stages"] = ["prompt_assemble"]
            record["prompt_assemble_ms"] = None
            record["other_ms"] = None  # docs/design.md: other needs all three parents
        elif status in ("timed_out", "orphan"):
            record |= {"first_token_at": None, "ttft_ms": None, "other_ms": None}
        record["record_version"] = record_version(record["event_count"], status, record["late_events"])
        out.append(record)
    return out
