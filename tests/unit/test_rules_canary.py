from __future__ import annotations

import numpy as np

from streams.rules import CanaryVerdict, RulesConfig, WindowEvaluation
from streams.rules.canary_stats import compare_naive, judge, tail_test
from tests.unit.rules_synth import Scenario, Traffic, make_engine, sketch

ARMS = {("t1", "v1"): "stable", ("t1", "v2"): "canary"}


def run_canary(stable: Traffic, canary: Traffic, windows: int = 6, seed: int = 21) -> list[WindowEvaluation]:
    scenario = Scenario(seed=seed, arms=ARMS)  # type: ignore[arg-type]
    engine = make_engine()
    out = []
    for i in range(windows):
        ws, snap = scenario.window(i, {"t1": {"v1": stable, "v2": canary}})
        out.append(engine.evaluate_window(ws, snap))
    return out


def verdicts(evaluations: list[WindowEvaluation], stage: str) -> list[CanaryVerdict]:
    return [v for ev in evaluations for v in ev.verdicts if v.stage == stage]


def test_slower_llm_with_low_draft_acceptance_fails_naming_the_stage() -> None:
    evaluations = run_canary(Traffic(), Traffic(llm_factor=1.35, draft_p50=0.5), windows=3)
    fired = [t for ev in evaluations for t in ev.transitions if t.state == "firing"]
    by_name = {(t.alertname, t.labels.get("stage")): t for t in fired}
    canary = by_name[("TTFTCanaryFailed", "llm_ttft")]
    assert canary.labels == {
        "alertname": "TTFTCanaryFailed",
        "tenant": "t1",
        "stage": "llm_ttft",
        "version": "v2",
        "severity": "page",
    }
    text = canary.annotations["description"]
    assert "fails on stage llm_ttft" in text and "relative" in text
    assert canary.numbers["ratio"] > 1.25
    draft = by_name[("TTFTDraftAcceptanceLow", "llm_ttft")]
    assert draft.labels["version"] == "v2"
    assert "fall back to the main model directly" in draft.annotations["description"]
    # Retrieval and prompt assembly did not change: they pass, and no alert names them.
    assert {v.verdict for v in verdicts(evaluations, "retrieval")} == {"pass"}
    assert {v.verdict for v in verdicts(evaluations, "prompt_assemble")} == {"pass"}
    assert not any(t.labels.get("stage") in ("retrieval", "prompt_assemble") for t in fired)
    # The stable arm's draft acceptance is fine: only the canary version is named.
    assert not any(t.labels.get("version") == "v1" for t in fired)


def test_mix_shift_alone_passes_after_adjustment_where_naive_p95_fails() -> None:
    evaluations = run_canary(Traffic(miss_share=0.3), Traffic(miss_share=0.65))
    last = {v.stage: v for v in evaluations[-1].verdicts}
    llm = last["llm_ttft"]
    # Naive: the canary's merged P95 is >10 % above stable's, significantly so: it would fail.
    assert llm.naive_verdict == "fail" and llm.naive_ratio is not None and llm.naive_ratio >= 1.10
    # Mix-adjusted: reweighted to the stable strata shares, the same data passes.
    assert llm.verdict == "pass" and llm.mix_adjusted and llm.ratio is not None and llm.ratio < 1.05
    assert "naive comparison would fail" in llm.explanation
    assert any("cache=miss" in d or "cache=hit" in d for d in llm.drivers)
    assert not any(t.alertname == "TTFTCanaryFailed" for ev in evaluations for t in ev.transitions)
    assert {v.verdict for ev in evaluations for v in ev.verdicts} == {"pass"}


def test_too_few_samples_is_insufficient_traffic_never_a_pass() -> None:
    evaluations = run_canary(Traffic(), Traffic(n=100, llm_factor=1.35))
    assert {v.verdict for ev in evaluations for v in ev.verdicts} == {"insufficient_traffic"}
    assert all(v.reason == "samples" for ev in evaluations for v in ev.verdicts)
    # The span is cumulative from the canary's first window: it grew with the canary's lifetime.
    assert [v.span_windows for v in verdicts(evaluations, "llm_ttft")] == [1, 2, 3, 4, 5, 6]
    outcomes = {(e.outcome, e.samples) for e in evaluations[-1].evaluations if e.rule == "TTFTCanaryFailed"}
    assert outcomes == {("insufficient_traffic", 600)}
    assert not any(t.alertname == "TTFTCanaryFailed" for ev in evaluations for t in ev.transitions)


def test_critical_ratio_fails_at_once() -> None:
    evaluations = run_canary(Traffic(), Traffic(llm_factor=1.8), windows=1)
    fired = [t for t in evaluations[0].transitions if t.alertname == "TTFTCanaryFailed"]
    assert {t.labels["stage"] for t in fired if t.state == "firing"} >= {"llm_ttft"}
    assert verdicts(evaluations, "llm_ttft")[0].reason == "critical"


def test_verdict_rows_every_evaluation_with_table_columns() -> None:
    evaluations = run_canary(Traffic(), Traffic(), windows=2)
    rows = [v.to_row() for ev in evaluations for v in ev.verdicts]
    assert len(rows) == 2 * len(RulesConfig().canary.stages)
    assert {r["stage"] for r in rows} == set(RulesConfig().canary.stages)
    assert all(r["canary_version"] == "v2" and r["stable_versions"] == ["v1"] for r in rows)


def test_tail_test_sees_a_tail_only_widening() -> None:
    rng = np.random.default_rng(4)
    stable = sketch(np.exp(6 + 0.6 * rng.standard_normal(3000)))
    canary = sketch(np.exp(6 + 0.78 * rng.standard_normal(3000)))  # same median, wider tail
    tail = tail_test(stable, canary, stable.count, canary.count, 0.95)
    assert tail.z > 3 and tail.p_value < 0.01
    result = judge(compare_naive(stable, canary), RulesConfig().canary, floor_ms=100.0, slo_ms=None)
    assert result.verdict == "fail"


def test_identical_arms_do_not_fail_the_tail_test() -> None:
    rng = np.random.default_rng(8)
    stable = sketch(np.exp(6 + 0.6 * rng.standard_normal(3000)))
    canary = sketch(np.exp(6 + 0.6 * rng.standard_normal(3000)))
    result = judge(compare_naive(stable, canary), RulesConfig().canary, floor_ms=100.0, slo_ms=None)
    assert result.verdict == "pass"
