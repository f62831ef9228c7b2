from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from streams.app.alerting_hook import AlertingHook
from streams.app.metrics import WorkerMetrics
from streams.core.whatif import RequestColumns, replay
from streams.core.whatif_levers import Scale
from streams.core.whatif_stats import lower_quantiles
from streams.rules.model import AlertTransition
from streams.rules.regression_replay import baseline_factor, replay_span, wants_replay, with_baseline_replay
from streams.settings import Settings
from streams.store.request_columns import read_request_columns

WINDOW_MS = 60_000
NOW = 1_800_000_000_000.0


def _transition(state: str = "firing", **numbers: float) -> AlertTransition:
    base = {"p95_short_ms": 900.0, "p95_baseline_ms": 600.0, "span_windows": 2.0}
    return AlertTransition(
        alertname="TTFTStageRegression",
        labels={"alertname": "TTFTStageRegression", "tenant": "acme", "stage": "retrieval", "severity": "page"},
        annotations={"summary": "retrieval P95 regressed for tenant acme", "description": "retrieval P95 ... x1.50."},
        numbers={**base, **numbers},
        state=state,  # type: ignore[arg-type]
        window_start=NOW,
        active_at=NOW - WINDOW_MS,
        fired_at=NOW if state == "firing" else None,
    )


def _columns(n: int = 400, seed: int = 3) -> RequestColumns:
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        slow = float(rng.lognormal(0.0, 0.4))
        retrieval, assemble, llm = 450.0 * slow, 80.0 * slow, 900.0 * slow * float(rng.lognormal(0.0, 0.1))
        records.append(
            {
                "status": "complete",
                "first_token_at": 1.0,
                "retrieval_ms": retrieval,
                "prompt_assemble_ms": assemble,
                "llm_ttft_ms": llm,
                "ttft_ms": retrieval + assemble + llm + 5.0,
            }
        )
    return RequestColumns.from_records(records)


def test_a_firing_regression_gets_ttft_p95_with_the_stage_at_baseline() -> None:
    columns = _columns()
    enriched = with_baseline_replay(_transition(), columns)
    expected = replay(columns, [Scale("retrieval", 600.0 / 900.0)])
    (now,) = lower_quantiles(columns.ttft, [0.95])
    (at_baseline,) = lower_quantiles(expected.predicted, [0.95])
    assert at_baseline < now
    first, line = enriched.annotations["description"].split("\n")
    assert first == "retrieval P95 ... x1.50."
    assert line == (
        f"TTFT P95 with retrieval at baseline: {at_baseline:,.0f} ms (now {now:,.0f} ms); 400 requests of the last "
        "2 window(s) replayed with retrieval x0.67"
    )
    assert enriched.numbers["ttft_p95_ms"] == now
    assert enriched.numbers["ttft_p95_at_baseline_ms"] == at_baseline
    assert enriched.numbers["baseline_factor"] == pytest.approx(2 / 3)
    assert enriched.numbers["replayed_requests"] == 400.0
    assert (enriched.fingerprint, enriched.labels, enriched.state) == (
        _transition().fingerprint,
        _transition().labels,
        "firing",
    )


def test_only_firing_stage_regressions_with_numbers_are_replayed() -> None:
    columns = _columns()
    assert wants_replay(_transition())
    for transition in (
        _transition("pending"),
        _transition("resolved"),
        _transition(p95_baseline_ms=0.0),
        AlertTransition("TTFTCanaryFailed", {"stage": "llm_ttft"}, {}, {}, "firing", NOW, NOW, NOW),
    ):
        assert not wants_replay(transition)
        assert with_baseline_replay(transition, columns) == transition
    assert with_baseline_replay(_transition(), _columns(n=0)) == _transition()
    assert baseline_factor(_transition()) == pytest.approx(2 / 3)


def test_the_replay_reads_the_short_span_of_the_stable_arm() -> None:
    assert replay_span(_transition(), WINDOW_MS) == (int(NOW - WINDOW_MS), int(NOW + WINDOW_MS))
    assert replay_span(_transition(span_windows=1.0), WINDOW_MS) == (int(NOW), int(NOW + WINDOW_MS))
    calls: list[tuple[Any, ...]] = []
    columns = _columns()

    async def store_call(fn: Any, *args: Any) -> Any:
        calls.append((fn.func, fn.keywords, args))
        return columns

    async def publish(topic: str, key: bytes, value: bytes) -> None:
        return None

    hook = AlertingHook(Settings(), WorkerMetrics("writer", "w-1"), store_call, publish, lambda: None)
    arms = {("acme", "v13"): "canary", ("acme", "v12"): "stable", ("globex", "v9"): "canary"}
    pending = _transition("pending")
    out = asyncio.run(hook._with_replays([pending, _transition()], arms))
    assert out[0] == pending
    assert "TTFT P95 with retrieval at baseline" in out[1].annotations["description"]
    assert calls == [
        (
            read_request_columns,
            {"tenant": "acme", "exclude_versions": ["v13"]},
            ("ttft", int(NOW - WINDOW_MS), int(NOW + WINDOW_MS)),
        )
    ]
