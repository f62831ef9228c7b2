"""Tail attribution: which stage makes the slowest requests slow ("cut this stage first").

Per window x tenant x version, over ``complete`` records with a TTFT (at least :data:`MIN_RECORDS`, else
status ``insufficient_data``):

- the tail is the requests with TTFT strictly above the window's TTFT P95 (exact order statistic, numpy
  ``method='lower'``); the band is the requests between the 40th and 60th percentiles (inclusive);
- a stage's share of TTFT in a set is ``sum(stage) / sum(ttft)`` over the set (a ratio of sums, so a few
  tiny requests cannot dominate); shares cover the parents and the signed ``other`` gap, so they add up
  to 1;
- ``biggest_p95_stage`` is the parent with the largest exact P95; ``tail_dominant_stage`` the parent whose
  share grows most from the band to the tail. They may differ: a stage can be big everywhere, or small
  but erratic.
- ``exemplar_request_ids``: the window's :data:`EXEMPLARS` slowest eligible requests, slowest first, also
  when the window has too few records to attribute (an alert on a quiet tenant still names slow requests;
  readers of shares use ``ok`` rows only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from streams.core.health import lower_quantile
from streams.core.series import Series
from streams.core.stages import OTHER, Record
from streams.settings import PARENT_STAGES

MIN_RECORDS: Final = 200
TAIL_Q: Final = 0.95
BAND: Final = (0.4, 0.6)
EXEMPLARS: Final = 5
SHARE_STAGES: Final = (*PARENT_STAGES, OTHER)
#: A tail-dominant stage beats the largest tail stage only when its share grows by this much (10 points).
DOMINANCE_DELTA: Final = 0.10
OK: Final = "ok"
INSUFFICIENT: Final = "insufficient_data"


def _stage_ms(record: Record, stage: str) -> float:
    # A complete record lacks a parent only when its route does not run it: that stage took no time.
    value = record.get(f"{stage}_ms")
    return float(value) if value is not None else 0.0


def _shares(records: Sequence[Record]) -> dict[str, float]:
    total = math.fsum(float(r["ttft_ms"]) for r in records)
    if total <= 0.0:
        return {}
    return {stage: math.fsum(_stage_ms(r, stage) for r in records) / total for stage in SHARE_STAGES}


def _argmax(values: Mapping[str, float], stages: Sequence[str]) -> str:
    candidates = [s for s in stages if s in values]
    return max(candidates, key=lambda s: (values[s], -stages.index(s))) if candidates else ""


def tail_attribution_row(
    window_start: int, series: Series, records: Sequence[Record], computed_version: int = 0
) -> dict[str, Any]:
    """One ``tail_attribution`` row for the records of one series in one window."""
    eligible = [
        r
        for r in records
        if r.get("status") == "complete" and r.get("ttft_ms") is not None and r.get("first_token_at") is not None
    ]
    row: dict[str, Any] = {
        "window_start": window_start,
        "tenant_id": series[0],
        "version_id": series[1],
        "status": INSUFFICIENT,
        "n": len(eligible),
        "ttft_p95": None,
        "tail_count": 0,
        "band_count": 0,
        "biggest_p95_stage": "",
        "tail_dominant_stage": "",
        "stage_p95": {},
        "tail_share": {},
        "band_share": {},
        "share_delta": {},
        "exemplar_request_ids": [str(r["request_id"]) for r in _slowest(eligible)],
        "computed_version": computed_version,
    }
    if len(eligible) < MIN_RECORDS:
        return row
    ttfts = sorted(float(r["ttft_ms"]) for r in eligible)
    p95 = lower_quantile(ttfts, TAIL_Q)
    low, high = lower_quantile(ttfts, BAND[0]), lower_quantile(ttfts, BAND[1])
    assert p95 is not None and low is not None and high is not None
    tail = [r for r in eligible if float(r["ttft_ms"]) > p95]
    band = [r for r in eligible if low <= float(r["ttft_ms"]) <= high]
    tail_share, band_share = _shares(tail), _shares(band)
    stage_p95: dict[str, float] = {}
    for stage in PARENT_STAGES:
        values = sorted(float(r[f"{stage}_ms"]) for r in eligible if r.get(f"{stage}_ms") is not None)
        value = lower_quantile(values, TAIL_Q)
        if value is not None:
            stage_p95[stage] = value
    row |= {"ttft_p95": p95, "tail_count": len(tail), "band_count": len(band), "stage_p95": stage_p95}
    row["biggest_p95_stage"] = _argmax(stage_p95, PARENT_STAGES)
    if not tail_share or not band_share:
        return row  # every TTFT equal (nothing above P95): no tail to attribute
    delta = {stage: tail_share[stage] - band_share[stage] for stage in SHARE_STAGES}
    row |= {
        "status": OK,
        "tail_dominant_stage": _argmax(delta, PARENT_STAGES),
        "tail_share": tail_share,
        "band_share": band_share,
        "share_delta": delta,
    }
    return row


def _slowest(records: Sequence[Record]) -> list[Record]:
    return sorted(records, key=lambda r: (-float(r["ttft_ms"]), str(r["request_id"])))[:EXEMPLARS]


def _weighted_shares(rows: Sequence[Mapping[str, Any]], shares: str, weight: str) -> dict[str, float]:
    total = sum(int(r[weight]) for r in rows)
    if total == 0:
        return {}
    return {
        stage: sum(float(r[shares].get(stage, 0.0)) * int(r[weight]) for r in rows) / total for stage in SHARE_STAGES
    }


def advice(stage_p95: Mapping[str, float | None], attributions: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The parent stage to cut first over a span, and why.

    ``stage_p95`` holds the span's stage P95s (from merged bins); ``attributions`` the span's
    ``tail_attribution`` rows, whose shares are combined weighted by their tail and band counts. The
    choice is the stage with the largest share of TTFT in the slowest 5 %, unless another stage's share
    grows by at least :data:`DOMINANCE_DELTA` more from typical to slow requests: then that stage is what
    makes slow requests slow.
    """
    p95 = {s: float(v) for s, v in stage_p95.items() if s in PARENT_STAGES and v is not None}
    biggest = _argmax(p95, PARENT_STAGES)
    ok = [a for a in attributions if a.get("status") == OK]
    if not ok:
        if not biggest:
            return "", "no latency data in the span"
        return biggest, (
            f"{biggest} has the largest stage P95 ({p95[biggest]:.0f} ms); too few complete requests "
            f"(< {MIN_RECORDS} per window) to attribute the tail"
        )
    tail = _weighted_shares(ok, "tail_share", "tail_count")
    band = _weighted_shares(ok, "band_share", "band_count")
    delta = {s: tail[s] - band.get(s, 0.0) for s in tail}
    lead = _argmax(tail, PARENT_STAGES)
    dominant = _argmax(delta, PARENT_STAGES)
    if dominant != lead and delta[dominant] - delta[lead] >= DOMINANCE_DELTA:
        choice = dominant
        reason = (
            f"{dominant} makes slow requests slow: its share of TTFT rises from {band[dominant]:.0%} in "
            f"typical requests to {tail[dominant]:.0%} in the slowest 5 %"
        )
    else:
        choice = lead
        reason = f"{lead} takes the largest share of TTFT in the slowest 5 % ({tail[lead]:.0%}"
        reason += f", {band.get(lead, 0.0):.0%} in typical requests)"
        if lead in p95:
            reason += f" and has P95 {p95[lead]:.0f} ms"
            if biggest and biggest != lead:
                reason += f" ({biggest} has the larger P95, {p95[biggest]:.0f} ms, but weighs less in the tail)"
    if tail.get(OTHER, 0.0) > tail[choice]:
        reason += f"; the unattributed gap is {tail[OTHER]:.0%} of slow requests: instrument it"
    return choice, reason
