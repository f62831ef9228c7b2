"""How a recall-leg cut rolls up into retrieval: the critical path against "the same amount".

Issue 26 asked that cutting a sub-stage shorten ``retrieval`` "by the same amount". ``ttft whatif`` rolls a
change up through retrieval's critical path instead (:meth:`streams.core.whatif._Stages._path`): serial
recall counts both legs, parallel recall the longer one. This measures the two rules where they differ,
on the simulator's requests (retrieval = recall, parallel or serial, then rerank): the same requests (the
same random draws, request by request) in a world where one recall leg is twice as fast are the truth,
and each rule predicts that world's TTFT P95 from the world before it.

    .venv/bin/python -m bench.whatif_rollup [--requests 20000]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from streams.core import whatif
from streams.core.join_record import recall_mode
from streams.core.whatif import RequestColumns, predict
from streams.core.whatif_levers import Scale
from streams.sim.model import RequestProfile, simulate_request

T0_MS = 1_796_000_000_000.0


def records(profile: RequestProfile, n: int) -> list[dict[str, Any]]:
    """One complete record per simulated request (request ``i`` draws from ``Random(i)`` in every world)."""
    out = []
    for i in range(n):
        events = simulate_request(random.Random(i), profile, T0_MS + i, f"r{i}")
        stages: dict[str, float] = {}
        spans: dict[str, list[tuple[float, float]]] = {"vector_recall": [], "bm25_recall": []}
        start = first = 0.0
        for e in events:
            if e["stage"] == "request_start":
                start = e["ts_ms"]
            elif e["stage"] == "first_token":
                first = e["ts_ms"]
            else:
                stages[e["stage"]] = stages.get(e["stage"], 0.0) + e["duration_ms"]
                if e["stage"] in spans:
                    spans[e["stage"]].append((e["ts_ms"], e["duration_ms"]))
        record: dict[str, Any] = {f"{s}_ms": v for s, v in stages.items()}
        record |= {
            "status": "complete",
            "ttft_ms": first - start,
            "first_token_at": first,
            "recall_mode": recall_mode(spans["vector_recall"], spans["bm25_recall"]),
            "route": "main",
        }
        out.append(record)
    return out


@contextmanager
def same_amount_rule() -> Iterator[None]:
    """Roll every sub-stage change up one for one (the issue's wording), whatever the recall mode."""
    original = whatif._Stages._path

    def summed(self: Any) -> Any:
        return sum(np.nan_to_num(self.stages[s]) for s in ("vector_recall", "bm25_recall", "rerank"))

    whatif._Stages._path = summed  # type: ignore[method-assign]
    try:
        yield
    finally:
        whatif._Stages._path = original  # type: ignore[method-assign]


def p95(recs: list[dict[str, Any]]) -> float:
    return float(predict(RequestColumns.from_records(recs), [], resamples=10).observed["p95"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    base = RequestProfile()
    print(
        f"{args.requests:,} simulated requests per world; legs: vector {base.vector_recall_ms:g} ms, "
        f"bm25 {base.bm25_recall_ms:g} ms (medians)"
    )
    print(f"{'recall':9} {'fix':24} {'observed after':>15} {'critical path':>22} {'same amount':>22}")
    for mode in ("parallel", "serial"):
        before_profile = dataclasses.replace(base, recall_mode=mode)
        before = records(before_profile, args.requests)
        columns = RequestColumns.from_records(before)
        for leg, field in (("bm25_recall", "bm25_recall_ms"), ("vector_recall", "vector_recall_ms")):
            after_profile = dataclasses.replace(before_profile, **{field: getattr(base, field) * 0.5})
            observed = p95(records(after_profile, args.requests))
            lever = [Scale(leg, 0.5)]
            ours = predict(columns, lever, resamples=200).predicted["p95"]
            with same_amount_rule():
                literal = predict(columns, lever, resamples=200).predicted["p95"]

            def err(x: float, observed: float = observed) -> str:
                return f"{x:8,.0f} ms ({(x - observed) / observed:+6.1%})"

            print(f"{mode:9} {leg + ' x0.5':24} {observed:12,.0f} ms {err(ours):>22} {err(literal):>22}")


if __name__ == "__main__":
    main()
