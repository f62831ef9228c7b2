"""The roll-up rule of ``ttft whatif`` against the truth of simulated worlds (bench.whatif_worlds.py).

Cutting a parallel recall leg shortens retrieval only as far as the critical path moves: predicted through
the critical path, the TTFT P95 of the world where the leg is twice as fast is exact; rolled up "by the same
amount" (issue 26's wording), it promises a gain that does not happen. Serial recall: both rules agree.
"""

from __future__ import annotations

import dataclasses

from bench.whatif_worlds import p95, records, same_amount_rule
from streams.core.whatif import RequestColumns, predict
from streams.core.whatif_levers import Scale
from streams.sim.model import RequestProfile

N = 2_000


def _errors(mode: str, leg: str) -> tuple[float, float]:
    before = dataclasses.replace(RequestProfile(), recall_mode=mode)
    after = dataclasses.replace(before, **{f"{leg}_ms": getattr(before, f"{leg}_ms") * 0.5})
    observed = p95(records(after, N))
    columns = RequestColumns.from_records(records(before, N))
    ours = predict(columns, [Scale(leg, 0.5)], resamples=10).predicted["p95"]
    with same_amount_rule():
        literal = predict(columns, [Scale(leg, 0.5)], resamples=10).predicted["p95"]
    return (ours - observed) / observed, (literal - observed) / observed


def test_a_parallel_legs_cut_rolls_up_through_the_critical_path() -> None:
    for leg in ("bm25_recall", "vector_recall"):
        ours, literal = _errors("parallel", leg)
        assert abs(ours) < 0.005, (leg, ours)
        assert literal < -0.01, (leg, literal)  # "the same amount" over-promises


def test_a_serial_legs_cut_rolls_up_one_for_one() -> None:
    ours, literal = _errors("serial", "bm25_recall")
    assert abs(ours) < 0.005 and abs(literal) < 0.005, (ours, literal)
