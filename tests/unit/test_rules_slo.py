from __future__ import annotations

from streams.rules import RulesConfig
from streams.rules_config import BurnWindowPair, SLOBurnRule
from tests.unit.rules_synth import Scenario, Traffic, make_engine


def test_too_little_history_says_so_and_does_not_evaluate() -> None:
    scenario = Scenario(seed=1, arms={("t1", "v1"): "stable"})
    engine = make_engine()
    # An outage from the first window: plenty of bad requests, but no long span to judge them over.
    for i in range(10):
        ws, snap = scenario.window(i, {"t1": {"v1": Traffic(complete_share=0.3)}})
        evaluation = engine.evaluate_window(ws, snap)
        burn = [e for e in evaluation.evaluations if e.rule == "TTFTSLOBurn"]
        assert [e.outcome for e in burn] == ["insufficient_history"]
        assert not any(t.alertname == "TTFTSLOBurn" for t in evaluation.transitions)


def test_fast_burn_pages_when_both_spans_burn_and_resolves_with_the_short_span() -> None:
    pairs = (BurnWindowPair(long_windows=12, short_windows=2, burn_rate=14.4),)
    config = RulesConfig(slo_burn=SLOBurnRule(pairs=pairs))
    scenario = Scenario(seed=2, arms={("t1", "v1"): "stable", ("t2", "v1"): "stable"})
    engine = make_engine(config)
    steps = []
    for i in range(26):
        outage = 15 <= i < 20
        traffic = {
            "t1": {"v1": Traffic(n=200, complete_share=0.5 if outage else 1.0)},
            "t2": {"v1": Traffic(n=200)},
        }
        ws, snap = scenario.window(i, traffic)
        for t in engine.evaluate_window(ws, snap).transitions:
            if t.alertname == "TTFTSLOBurn":
                steps.append((i, t.state, t.labels["tenant"], t.labels["severity"]))
    # 50 % bad against a 1 % budget burns x50; the 12-window span passes x14.4 on the 4th outage window.
    assert steps == [(18, "firing", "t1", "page"), (21, "resolved", "t1", "page")]
