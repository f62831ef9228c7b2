"""What-if at scale (issue 26): ``ttft whatif`` with one lever and 200 bootstrap resamples over 1M stored requests.

A child process fills a fresh chDB store in a temporary directory with ``N`` synthetic complete requests
(numpy, inserted in writer-sized batches of 20,000, so the table has parts to merge under ``FINAL`` as a
live store does), then times the read and the replay in-process for the details. Then ``ttft whatif
--scale retrieval=0.7 --resamples 200 --json`` runs as its own process, as a user runs it: the figure is its
wall time from spawn to exit (interpreter start, imports, opening the store, the ``FINAL`` read, the replay
and the bootstrap) and its peak RSS (``wait4``), the median and the largest of ``runs`` runs. One chDB
directory per process: the filling process has exited before the first ``ttft whatif`` opens the store.

``python -m bench.whatif [--requests N] [--runs R]`` runs the phase alone and prints its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
WINDOW_MS = 60_000
BATCH = 20_000
LEVER = ("--scale", "retrieval=0.7")
TENANTS = ("acme", "globex", "bücher-ü")
_TTFT = str(Path(sys.executable).with_name("ttft"))


def span_start_ms() -> int:
    """The start of the synthetic hour: the UTC day two days back, inside the store's 30-day retention."""
    return (int(time.time() * 1000) // DAY_MS - 2) * DAY_MS


def synthetic_columns(n: int, start_ms: int, seed: int = 26, offset: int = 0) -> dict[str, list[Any]]:
    """``n`` complete requests over one hour, shaped like the seed story's ``before`` world: a shared
    slowness per request, half of them with serial recall, prompt-cache hits and a fast route."""
    rng = np.random.default_rng([seed, offset])

    def stage(median: float, sigma: float = 0.12) -> np.ndarray:
        spread: np.ndarray = median * np.exp(sigma * rng.standard_normal(n))
        return spread

    shared = np.exp(0.45 * rng.standard_normal(n))
    vector, bm25, rerank = stage(136.0) * shared, stage(100.0) * shared, stage(199.0) * shared
    serial = rng.random(n) < 0.5
    retrieval = np.where(serial, vector + bm25 + 0.3, np.maximum(vector, bm25)) + rerank + 1.0
    tokens = np.maximum(120, 2_400.0 * np.exp(0.3 * rng.standard_normal(n))).astype(np.int64)
    hit = (tokens >= 1_024) & (rng.random(n) < 0.3)
    assemble = stage(59.0) * (1.0 + 0.84 * tokens / 1_000.0) * np.where(hit, 0.64, 1.0) * shared
    fast = rng.random(n) < 0.4
    uncached = np.where(hit, tokens * 0.6, tokens)
    llm = (595.0 + 102.0 * uncached / 1_000.0) * np.exp(0.12 * rng.standard_normal(n)) * shared
    llm *= np.where(fast, 0.4, 1.0)
    other = 2.0 + rng.exponential(8.0, n)
    ttft = retrieval + assemble + llm + other
    started = start_ms + np.sort(rng.uniform(0.0, HOUR_MS, n))
    first_token = started + ttft
    return {
        "request_id": [f"wi-{offset + i:08d}" for i in range(n)],
        "tenant_id": [TENANTS[i] for i in rng.integers(0, len(TENANTS), n).tolist()],
        "version_id": ["v12"] * n,
        "route": np.where(fast, "fast", "main").tolist(),
        "status": ["complete"] * n,
        "started_at": np.round(started).astype(np.int64).tolist(),
        "first_token_at": np.round(first_token).astype(np.int64).tolist(),
        "window_start": (started // WINDOW_MS * WINDOW_MS).astype(np.int64).tolist(),
        "ttft_ms": ttft.tolist(),
        "retrieval_ms": retrieval.tolist(),
        "vector_recall_ms": vector.tolist(),
        "bm25_recall_ms": bm25.tolist(),
        "rerank_ms": rerank.tolist(),
        "prompt_assemble_ms": assemble.tolist(),
        "llm_ttft_ms": llm.tolist(),
        "other_ms": other.tolist(),
        "recall_mode": np.where(serial, "serial", "parallel").tolist(),
        "prompt_tokens": tokens.tolist(),
        "prompt_cache_hit": hit.tolist(),
        "fallback_level": [0] * n,
        "duplicate_events": [0] * n,
        "late_events": [0] * n,
        "event_count": [8] * n,
        "record_version": [(8 << 8) | (3 << 4)] * n,
    }


def _fill(home: Path, requests: int, start_ms: int) -> dict[str, Any]:
    """In the child process: create the store, insert the requests in batches, time a read and a replay."""
    from streams.core.whatif import predict
    from streams.core.whatif_levers import parse_scale
    from streams.settings import load_settings
    from streams.store.client import make_client
    from streams.store.migrate import apply_migrations
    from streams.views.reads import request_columns
    from streams.views.span import Span

    os.environ["TTFT_HOME"] = str(home)
    settings = load_settings()
    client = make_client(settings)
    database = settings.clickhouse_database
    apply_migrations(client, database)
    started = time.monotonic()
    for offset in range(0, requests, BATCH):
        columns = synthetic_columns(min(BATCH, requests - offset), start_ms, offset=offset)
        client.insert(
            "requests", list(columns.values()), column_names=list(columns), database=database, column_oriented=True
        )
    filled = time.monotonic() - started
    parts = client.command(
        f"SELECT count() FROM system.parts WHERE database = '{database}' AND table = 'requests' AND active"
    )
    started = time.monotonic()
    read = request_columns(client, database, Span(start_ms, start_ms + HOUR_MS, "absolute"))
    read_s = time.monotonic() - started
    started = time.monotonic()
    predict(read, [parse_scale(LEVER[1])], resamples=200)
    return {
        "fill_seconds": filled,
        "active_parts": int(str(parts)),
        "read_seconds_in_process": read_s,
        "replay_seconds_in_process": time.monotonic() - started,
        "requests_read": read.n,
    }


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one process, from spawn to exit."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[:3]} exited {proc.returncode}: {err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss / 1024.0, out.read().decode()


def measure_whatif(requests: int = 1_000_000, runs: int = 3, resamples: int = 200) -> dict[str, Any]:
    """The phase: fill a store, then time ``ttft whatif`` (one lever) and ``ttft whatif --rank`` over it."""
    root = Path(tempfile.mkdtemp(prefix="ttft-bench-whatif-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    env["TTFT_HOME"] = str(root)
    start_ms = span_start_ms()
    try:
        fill_args = [sys.executable, "-m", "bench.whatif", "fill", str(root), str(requests), str(start_ms)]
        fill_wall, fill_rss, fill_out = _timed(fill_args, env)
        fill = json.loads(fill_out)
        span = ["--since", str(start_ms), "--until", str(start_ms + HOUR_MS)]
        walls, rss = [], []
        answer: dict[str, Any] = {}
        for _ in range(runs):
            args = [_TTFT, "whatif", *span, *LEVER, "--resamples", str(resamples), "--json"]
            wall, peak, out = _timed(args, env)
            walls.append(wall)
            rss.append(peak)
            answer = json.loads(out)
        if answer.get("requests") != requests:
            raise RuntimeError(f"ttft whatif replayed {answer.get('requests')} requests, not {requests}")
        rank_wall, rank_rss, _ = _timed([_TTFT, "whatif", *span, "--rank", "--json"], env)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "figures": {
            "whatif_requests": float(requests),
            "whatif_seconds": statistics.median(walls),
            "whatif_seconds_max": max(walls),
            "whatif_rss_peak_mb": max(rss),
            "whatif_rank_seconds": rank_wall,
        },
        "details": {
            **fill,
            "fill_process_seconds": fill_wall,
            "fill_process_rss_mb": fill_rss,
            "lever": " ".join(LEVER),
            "resamples": resamples,
            "whatif_seconds_each": walls,
            "whatif_rss_mb_each": rss,
            "rank_rss_mb": rank_rss,
            "answer": answer,
        },
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fill"]:
        home, requests, start_ms = Path(argv[1]), int(argv[2]), int(argv[3])
        print(json.dumps(_fill(home, requests, start_ms)))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.whatif", description=__doc__)
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--resamples", type=int, default=200)
    args = p.parse_args(argv)
    print(json.dumps(measure_whatif(args.requests, args.runs, args.resamples), indent=2))
    return 0


if __name__ == "__main__":
    from streams.store.shutdown import exit_process

    exit_process(main())
