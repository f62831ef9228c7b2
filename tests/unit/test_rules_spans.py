from __future__ import annotations

import numpy as np

from streams.core.sketch import LatencySketch
from streams.rules import RulesConfig
from streams.rules.history import WindowHistory, merge_sketches
from streams.rules.regression import Baselines, StageHistory, choose_spans
from streams.rules_config import StageRegressionRule
from tests.unit.rules_synth import W_MS, Scenario, Traffic, make_engine, sketch


def series(windows: int, counts: list[int], seed: int = 1) -> StageHistory:
    rng = np.random.default_rng(seed)
    history: StageHistory = WindowHistory(W_MS, 200)
    for i in range(windows):
        n = counts[i % len(counts)]
        sk = sketch(300 * np.exp(0.3 * rng.standard_normal(n))) if n else LatencySketch(0.01)
        history.add(("t", "retrieval"), i * W_MS, (sk, i % 17 == 5))  # every 17th window degraded
    return history


def test_spans_grow_to_the_sample_gate_and_stop_at_the_maximum() -> None:
    rule = StageRegressionRule()
    history = series(100, [30])
    spans = choose_spans(history, ("t", "retrieval"), rule, 99 * W_MS, W_MS)
    assert (spans.short_len, spans.long_len) == (15, 19) and spans.samples >= 400  # 14 + a degraded window
    busy = series(100, [900])
    spans = choose_spans(busy, ("t", "retrieval"), rule, 99 * W_MS, W_MS)
    assert (spans.short_len, spans.long_len, spans.samples) == (1, 5, 900)  # today's spans, never shorter
    quiet = series(100, [5])
    spans = choose_spans(quiet, ("t", "retrieval"), rule, 99 * W_MS, W_MS)
    assert (spans.short_len, spans.long_len) == (30, 30) and spans.samples < 400


def test_the_rolling_baseline_equals_a_fresh_merge_whatever_the_span_does() -> None:
    rule = StageRegressionRule(baseline_windows=20, min_baseline_samples=10)
    history = series(150, [40, 0, 7, 300])
    baselines = Baselines(history, rule, W_MS, 0.01)
    rng = np.random.default_rng(3)
    baselines.exclude(("t", "retrieval"), 40 * W_MS, 44 * W_MS)
    for now in range(30, 150):
        long_len = int(rng.integers(5, 31))
        got = baselines.sketch(("t", "retrieval"), now * W_MS, long_len)
        first, last = baselines.range(now * W_MS, long_len)
        parts = [
            sk
            for ws, (sk, degraded) in history.items(("t", "retrieval"), first, last)
            if not degraded and not 40 * W_MS <= ws <= 44 * W_MS
        ]
        want = merge_sketches(parts, 0.01) if parts else LatencySketch(0.01)
        assert (got.bins, got.zero_count, got.count) == (dict(want.bins), want.zero_count, want.count), now


def test_a_second_regression_soon_after_a_resolved_one_fires_again() -> None:
    # The baseline never absorbs the first incident, so the second is judged against the level before it.
    scenario = Scenario(seed=5, arms={("t1", "v1"): "stable"})
    engine = make_engine(RulesConfig())
    slow = set(range(70, 82)) | set(range(90, 105))
    firing = []
    for i in range(115):
        ws, snap = scenario.window(i, {"t1": {"v1": Traffic(n=400, retrieval_factor=1.5 if i in slow else 1.0)}})
        out = engine.evaluate_window(ws, snap)
        firing += [(i, t.state) for t in out.transitions if t.alertname == "TTFTStageRegression"]
    fired = [i for i, state in firing if state == "firing"]
    resolved = [i for i, state in firing if state == "resolved"]
    assert len(fired) == 2 and 70 <= fired[0] <= 73 and 90 <= fired[1] <= 93, firing
    assert len(resolved) == 2 and 82 <= resolved[0] <= 85 and resolved[1] >= 105, firing


def test_a_lasting_new_level_is_absorbed_once_and_does_not_fire_again() -> None:
    scenario = Scenario(seed=6, arms={("t1", "v1"): "stable"})
    engine = make_engine(RulesConfig())
    steps = []
    for i in range(230):
        ws, snap = scenario.window(i, {"t1": {"v1": Traffic(n=400, retrieval_factor=1.5 if i >= 70 else 1.0)}})
        out = engine.evaluate_window(ws, snap)
        steps += [(i, t.state) for t in out.transitions if t.alertname == "TTFTStageRegression"]
    states = [state for _, state in steps]
    assert states == ["pending", "firing", "resolved"], steps  # fired, then the baseline took the new level
    assert 70 <= steps[1][0] <= 73 and steps[2][0] > 90
