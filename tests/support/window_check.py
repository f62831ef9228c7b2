"""Compare the stored window sketches of a filled store with numpy over ``requests`` (a subprocess: chDB
holds one data directory per process). Prints one JSON document; the test asserts on it."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from streams.store.shutdown import exit_process

PARENTS = ("retrieval", "prompt_assemble", "llm_ttft")
COLUMNS = {
    "retrieval": "retrieval_ms",
    "prompt_assemble": "prompt_assemble_ms",
    "llm_ttft": "llm_ttft_ms",
    "vector_recall": "vector_recall_ms",
    "bm25_recall": "bm25_recall_ms",
    "rerank": "rerank_ms",
    "ttft": "ttft_ms",
}


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-9)


def main() -> None:
    from streams.core.rollup import rollup_rows
    from streams.settings import load_settings
    from streams.store.client import make_client

    settings = load_settings()
    client = make_client(settings)
    db = settings.clickhouse_database
    cols = ", ".join(COLUMNS.values())
    rows = client.query(
        f"SELECT toUnixTimestamp64Milli(window_start), tenant_id, version_id, status, {cols} FROM {db}.requests FINAL"
    ).result_rows
    values: dict[tuple[int, str, str, str], list[float]] = defaultdict(list)
    hourly: dict[tuple[int, str, str, str], list[float]] = defaultdict(list)
    for ws, tenant, version, status, *vals in rows:
        if status not in ("complete", "missing_stage"):
            continue
        for stage, v in zip(COLUMNS, vals, strict=True):
            if v is None:
                continue
            values[(int(ws), tenant, version, stage)].append(float(v))
            hourly[(int(ws) // 3_600_000 * 3_600_000, tenant, version, stage)].append(float(v))
    stored = client.query(
        f"SELECT toUnixTimestamp64Milli(window_start), tenant_id, version_id, stage, count, p50, p95, p99, "
        f"bins, zero_count, relative_accuracy FROM {db}.stage_windows FINAL"
    ).result_rows
    checked = 0
    worst = 0.0
    failures: list[str] = []
    count_mismatch: list[str] = []
    window_rows: list[dict[str, Any]] = []
    for ws, tenant, version, stage, count, p50, p95, p99, bins, zero, acc in stored:
        window_rows.append(
            {
                "window_start": int(ws),
                "tenant_id": tenant,
                "version_id": version,
                "stage": stage,
                "count": count,
                "bins": bins,
                "zero_count": zero,
                "relative_accuracy": acc,
            }
        )
        if stage not in COLUMNS:
            continue
        xs = values.get((int(ws), tenant, version, stage), [])
        if len(xs) != count:
            count_mismatch.append(f"{ws}/{tenant}/{version}/{stage}: stored {count} numpy {len(xs)}")
            continue
        if count < 50:
            continue
        arr = np.asarray(xs)
        for name, q, got in (("p50", 0.5, p50), ("p95", 0.95, p95), ("p99", 0.99, p99)):
            want = float(np.quantile(arr, q, method="lower"))
            err = _rel(got, want)
            worst = max(worst, err)
            checked += 1
            if err > 0.01 + 1e-9:
                failures.append(f"{ws}/{tenant}/{version}/{stage} {name}: {got} vs {want}")
    # Hourly rollup: Python over stored rows, SQL over the same table, numpy over requests.
    for row in window_rows:
        row["hour"] = row["window_start"] // 3_600_000 * 3_600_000
    py = rollup_rows(window_rows, group_by=("hour", "tenant_id", "version_id", "stage"))
    sql_rows = client.query(
        f"SELECT intDiv(toUnixTimestamp64Milli(window_start), 3600000) * 3600000 AS hour, tenant_id, version_id, "
        f"stage, ttftSketchQuantile(sumMap(bins), sum(zero_count), 0.95, any(relative_accuracy)) AS p95 "
        f"FROM {db}.stage_windows FINAL GROUP BY hour, tenant_id, version_id, stage"
    ).result_rows
    rollup_checked = 0
    rollup_failures: list[str] = []
    for hour, tenant, version, stage, sql_p95 in sql_rows:
        py_p95 = py[(int(hour), tenant, version, stage)].quantile(0.95)
        if py_p95 != sql_p95:
            rollup_failures.append(f"{hour}/{tenant}/{version}/{stage}: python {py_p95} sql {sql_p95}")
        xs = hourly.get((int(hour), tenant, version, stage))
        if stage in COLUMNS and xs and len(xs) >= 50:
            want = float(np.quantile(np.asarray(xs), 0.95, method="lower"))
            if sql_p95 is None or _rel(sql_p95, want) > 0.01 + 1e-9:
                rollup_failures.append(f"{hour}/{tenant}/{version}/{stage}: sql {sql_p95} numpy {want}")
            rollup_checked += 1
    alerts = client.query(
        f"SELECT alertname, state, count() FROM {db}.alerts FINAL GROUP BY alertname, state ORDER BY alertname, state"
    ).result_rows
    verdicts = client.query(
        f"SELECT verdict, count() FROM {db}.canary_verdicts FINAL GROUP BY verdict ORDER BY verdict"
    ).result_rows
    print(
        json.dumps(
            {
                "alerts": [list(r) for r in alerts],
                "canary_verdicts": [list(r) for r in verdicts],
                "requests": len(rows),
                "stage_window_rows": len(stored),
                "checked": checked,
                "worst_relative_error": worst,
                "failures": failures[:20],
                "count_mismatch": count_mismatch[:20],
                "rollup_checked": rollup_checked,
                "rollup_failures": rollup_failures[:20],
            }
        )
    )


if __name__ == "__main__":
    main()
    exit_process(0)
