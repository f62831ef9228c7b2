"""TTFTStageRegression's last description line: what TTFT's P95 would be with the stage back at its baseline.

A stage's P95 ratio does not say what the regression costs end to end (stage P95s do not add up to
TTFT's). When the alert fires, the requests of its short span (the windows its ``p95_short_ms`` came from)
are replayed by ``ttft whatif``'s core with the regressed stage scaled back by ``p95_baseline_ms /
p95_short_ms``, the rule's own numbers, and one line is added to the description::

    TTFT P95 with retrieval at baseline: 1,818 ms (now 2,041 ms); 700 requests of the last 2 window(s)
    replayed with retrieval x0.66

The numbers go to ``numbers`` too (``ttft_p95_ms``, ``ttft_p95_at_baseline_ms``, ``baseline_factor``,
``replayed_requests``). Pure: the caller reads the requests (:mod:`streams.app.alerting_hook`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from streams.core.whatif import RequestColumns, replay
from streams.core.whatif_levers import LEVER_STAGES, Scale
from streams.core.whatif_stats import lower_quantiles
from streams.rules.model import AlertTransition

REGRESSION: Final = "TTFTStageRegression"


def wants_replay(transition: AlertTransition) -> bool:
    """A stage regression going to ``firing`` on a stage the replay knows, with the rule's numbers."""
    return (
        transition.alertname == REGRESSION
        and transition.state == "firing"
        and transition.labels.get("stage") in LEVER_STAGES
        and baseline_factor(transition) is not None
    )


def baseline_factor(transition: AlertTransition) -> float | None:
    """``p95_baseline_ms / p95_short_ms``: the scale that takes the stage's P95 back to its baseline."""
    base, short = transition.numbers.get("p95_baseline_ms"), transition.numbers.get("p95_short_ms")
    if base is None or short is None or base <= 0.0 or short <= 0.0:
        return None
    return base / short


def replay_span(transition: AlertTransition, window_ms: float) -> tuple[int, int]:
    """``[start, end)`` (epoch ms, window starts) of the short span the transition was judged over."""
    windows = max(1, int(transition.numbers.get("span_windows", 1.0)))
    end = transition.window_start + window_ms
    return int(end - windows * window_ms), int(end)


def with_baseline_replay(transition: AlertTransition, columns: RequestColumns) -> AlertTransition:
    """The transition with the replay's line added to its description and its numbers (unchanged when
    :func:`wants_replay` says no or no request was replayed)."""
    factor = baseline_factor(transition)
    if not wants_replay(transition) or factor is None or columns.n == 0:
        return transition
    stage = transition.labels["stage"]
    result = replay(columns, [Scale(stage, factor)])
    (observed,) = lower_quantiles(result.observed, [0.95])
    (predicted,) = lower_quantiles(result.predicted, [0.95])
    windows = int(transition.numbers.get("span_windows", 1.0))
    line = (
        f"TTFT P95 with {stage} at baseline: {predicted:,.0f} ms (now {observed:,.0f} ms); {columns.n:,} requests "
        f"of the last {windows} window(s) replayed with {stage} x{factor:.2f}"
    )
    description = transition.annotations.get("description", "")
    numbers = {
        **transition.numbers,
        "ttft_p95_ms": observed,
        "ttft_p95_at_baseline_ms": predicted,
        "baseline_factor": factor,
        "replayed_requests": float(columns.n),
    }
    annotations = {**transition.annotations, "description": f"{description}\n{line}" if description else line}
    return replace(transition, annotations=annotations, numbers=numbers)
