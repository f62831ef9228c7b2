"""Worker metrics as a time series in ``{database}.pipeline_stats`` (for dashboards).

A sample is a dict: ``ts`` (epoch ms), ``worker_id``, ``role``, ``metric`` (a closed set of names owned
by the worker, e.g. ``consumer_lag``, ``insert_latency_ms``, ``open_requests``, ``evictions``,
``series_cap_hits``), optional ``labels`` (str -> str, e.g. ``{"partition": "3"}``) and ``value``.
The table is append-only: write each sample once per scrape interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from clickhouse_connect.driver.client import Client

from streams.store.client import check_identifier
from streams.store.requests_store import SYNC_INSERT

STATS_COLUMNS: tuple[str, ...] = ("ts", "worker_id", "role", "metric", "labels", "value")

#: ``metric`` names (the health dashboard, streams/grafana/boards_health.py, reads exactly these).
CONSUMER_LAG: Final = "consumer_lag"  # labels: topic, partition
INSERT_LATENCY_MS: Final = "insert_latency_ms"  # labels: table
OPEN_REQUESTS: Final = "open_requests"
EVICTIONS: Final = "evictions"
SERIES_CAP_HITS: Final = "series_cap_hits"
#: The join's OTLP traces that start at a stage span (``ttft_otlp_cut_off_traces``): requests cut apart.
CUT_OFF_TRACES: Final = "otlp_cut_off_traces"
STATS_METRICS: Final = (CONSUMER_LAG, INSERT_LATENCY_MS, OPEN_REQUESTS, EVICTIONS, SERIES_CAP_HITS, CUT_OFF_TRACES)


def stat_sample(
    ts_ms: float, worker_id: str, role: str, metric: str, value: float, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """Build one sample dict for :func:`insert_stats`."""
    return {
        "ts": ts_ms,
        "worker_id": worker_id,
        "role": role,
        "metric": metric,
        "labels": dict(labels or {}),
        "value": float(value),
    }


def insert_stats(client: Client, database: str, samples: Sequence[dict[str, Any]]) -> None:
    """Insert metric samples in one synchronous batch."""
    if not samples:
        return
    rows = [
        [
            round(s["ts"]),
            s["worker_id"],
            s["role"],
            s["metric"],
            {str(k): str(v) for k, v in (s.get("labels") or {}).items()},
            float(s["value"]),
        ]
        for s in samples
    ]
    client.insert(
        "pipeline_stats",
        rows,
        column_names=list(STATS_COLUMNS),
        database=check_identifier(database),
        settings=SYNC_INSERT,
    )
