"""What-if predictions against simulated worlds: the roll-up rule of recall legs, and the prompt-cache fix.

Roll-up: how a recall-leg cut rolls up into retrieval, the critical path against "the same amount".

Issue 26 asked that cutting a sub-stage shorten ``retrieval`` "by the same amount". ``ttft whatif`` rolls a
change up through retrieval's critical path instead (:meth:`streams.core.whatif._Stages._path`): serial
recall counts both legs, parallel recall the longer one. This measures the two rules where they differ,
on the simulator's requests (retrieval = recall, parallel or serial, then rerank): the same requests (the
same random draws, request by request) in a world where one recall leg is twice as fast are the truth,
and each rule predicts that world's TTFT P95 from the world before it.

Prompt cache: the story's stable-prefix fix (``streams.sim.scenarios``: PARALLEL_RECALL -> STABLE_PREFIX: hits
go from <= 8 % to <= 97 % of the cacheable prompts, and a hit caches 75 % of its prompt instead of 40 %),
predicted with ``--all-cache-hits`` alone and with ``--cached-share 0.75`` after it.

    .venv/bin/python -m bench.whatif_worlds [--requests 20000]
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
from streams.core.whatif import RequestColumns, WhatIfRefused, predict
from streams.core.whatif_levers import AllCacheHits, CachedShare, Lever, Scale
from streams.sim.model import RequestProfile, simulate_request
from streams.sim.scenarios import PARALLEL_RECALL, STABLE_PREFIX

T0_MS = 1_796_000_000_000.0


def records(profile: RequestProfile, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """One complete record per simulated request (request ``i`` draws from ``Random((seed, i))`` in every
    world: the same seed pairs the worlds request by request, another seed is an independent sample)."""
    out = []
    for i in range(n):
        events = simulate_request(random.Random(seed * 1_000_003 + i), profile, T0_MS + i, f"r{i}")
        stages: dict[str, float] = {}
        spans: dict[str, list[tuple[float, float]]] = {"vector_recall": [], "bm25_recall": []}
        start = first = 0.0
        attrs: dict[str, Any] = {}
        for e in events:
            if e["stage"] == "request_start":
                start = e["ts_ms"]
            elif e["stage"] == "first_token":
                first = e["ts_ms"]
            else:
                stages[e["stage"]] = stages.get(e["stage"], 0.0) + e["duration_ms"]
                if e["stage"] in spans:
                    spans[e["stage"]].append((e["ts_ms"], e["duration_ms"]))
            if e["stage"] == "prompt_assemble":
                attrs = {k: e["attrs"][k] for k in ("prompt_tokens", "cached_tokens", "prompt_cache_hit")}
        record: dict[str, Any] = {f"{s}_ms": v for s, v in stages.items()} | attrs
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
    parser.add_argument("--phases", type=int, default=0, help="also: this many independent demo-sized phase pairs")
    parser.add_argument("--phase-requests", type=int, default=620, help="requests a phase (the 60 s demo's)")
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
    print()
    print(f"{'prompt cache fix, levers':58} {'predicted TTFT P95':>24}")
    for text, (observed, predicted) in cache_fix(args.requests).items():
        print(
            f"{text:58} {predicted:12,.0f} ms ({(predicted - observed) / observed:+6.1%})   observed {observed:,.0f} ms"
        )
    if args.phases:
        held: dict[str, list[float]] = {}
        for k in range(args.phases):
            for text, (observed, predicted) in cache_fix(args.phase_requests, 2 * k + 1, 2 * k + 2).items():
                held.setdefault(text, []).append((predicted - observed) / observed)
        print(f"\n{args.phases} independent pairs of {args.phase_requests}-request phases: within 5 %, median error")
        for text, errors in held.items():
            inside = sum(abs(e) <= 0.05 for e in errors)
            refused = sum(e != e for e in errors)
            print(f"  {text:68} {inside:3}/{args.phases} {float(np.nanmedian(errors)):+6.1%} ({refused} refused)")


def cache_fix(n: int, seed: int = 0, after_seed: int | None = None) -> dict[str, tuple[float, float]]:
    """The stable-prefix fix: observed TTFT P95 after it, and each lever set's prediction from the world before
    (``after_seed``: the world after drawn independently, as the demo's next phase is)."""
    before = RequestColumns.from_records(records(PARALLEL_RECALL, n, seed))
    observed = p95(records(STABLE_PREFIX, n, seed if after_seed is None else after_seed))
    assemble = Scale("prompt_assemble", PARALLEL_RECALL.assemble_cache_factor)
    sets: dict[str, list[Lever]] = {
        "--all-cache-hits --scale prompt_assemble=0.64": [AllCacheHits(), assemble],
        "--all-cache-hits --cached-share 0.75 --scale prompt_assemble=0.64": [
            AllCacheHits(),
            CachedShare(0.75),
            assemble,
        ],
        "--cache-hits 0.84 --cached-share 0.75 --scale prompt_assemble=0.64": [
            AllCacheHits(0.84),
            CachedShare(0.75),
            assemble,
        ],
    }
    out: dict[str, tuple[float, float]] = {}
    for text, levers in sets.items():
        try:
            out[text] = (observed, predict(before, levers, resamples=50, seed=seed, min_donors=1).predicted["p95"])
        except WhatIfRefused:  # no donor of some prompt size: counted as a miss
            out[text] = (observed, float("nan"))
    return out


if __name__ == "__main__":
    main()
