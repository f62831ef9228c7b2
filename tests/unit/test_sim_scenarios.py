from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import numpy as np
import orjson
import pytest

from schemas.events import StageEvent
from streams.sim import DEFAULT_TENANTS, SEED_STORY_TARGETS, generate, incident_tenant, phases
from streams.sim.model import simulate_request
from streams.sim.scenarios import CANARY_LLM_RATIO, ROUTING_SPECULATIVE, ProfileBook

START = 1_767_225_600_000.0


def _p95(values: list[float]) -> float:
    return float(np.quantile(np.asarray(values), 0.95, method="lower"))


def _records(messages: list[tuple[bytes, bytes, float]]) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for key, value, _ in messages:
        event = orjson.loads(value)
        assert key == event["request_id"].encode()
        record = records.setdefault(event["request_id"], {"labels": event, "accept": None})
        if "duration_ms" in event:
            record[event["stage"]] = record.get(event["stage"], 0.0) + event["duration_ms"]
        else:
            record[event["stage"]] = event["ts_ms"]
        if event["stage"] == "llm_ttft":
            record["accept"] = event.get("attrs", {}).get("draft_accept_rate")
    return records


def _run(scenario: str, rate: float, duration_s: float, seed: int = 1) -> list[tuple[bytes, bytes, float]]:
    return list(generate(scenario, rate_rps=rate, duration_s=duration_s, seed=seed, start_ms=START))


@pytest.mark.parametrize("phase_index", range(4))
def test_seed_story_phase_matches_its_calibrated_p95s(phase_index: int) -> None:
    book = ProfileBook("seed-story", DEFAULT_TENANTS)
    phase = book.phases[phase_index]
    rng = random.Random(100 + phase_index)
    values: dict[str, list[float]] = {"retrieval": [], "prompt_assemble": [], "llm_ttft": [], "ttft": []}
    for i in range(20_000):
        profile = book.profile(phase_index, i % len(DEFAULT_TENANTS), 0.5)
        sums: dict[str, float] = {}
        for e in simulate_request(rng, profile, START + i, f"r{i}"):
            sums[e["stage"]] = sums.get(e["stage"], 0.0) + e.get("duration_ms", e["ts_ms"])
        for stage in ("retrieval", "prompt_assemble", "llm_ttft"):
            values[stage].append(sums[stage])
        values["ttft"].append(sums["first_token"] - sums["request_start"])
    for stage, target in SEED_STORY_TARGETS[phase.name].items():
        assert _p95(values[stage]) == pytest.approx(target, rel=0.10), (phase.name, stage)


def test_seed_story_phases_change_one_thing_each_through_generate() -> None:
    messages = _run("seed-story", rate=40, duration_s=400)
    bounds = phases("seed-story", START, 400)
    assert [name for name, _, _ in bounds] == list(SEED_STORY_TARGETS)
    assert bounds[0][1] == START and bounds[-1][2] == START + 400_000
    assert all(a[2] == b[1] for a, b in itertools.pairwise(bounds))
    records = _records(messages)
    for name, lo, hi in bounds:
        inside = [r for r in records.values() if lo <= r["request_start"] < hi]
        assert len(inside) > 3_000
        routes = Counter(r["labels"]["route"] for r in inside)
        assert ("fast" in routes) == (name == "routing-speculative")
        assert all(r["labels"].get("rollout") is None for r in inside)
    ttft_before = [r["first_token"] - r["request_start"] for r in records.values() if r["request_start"] < bounds[0][2]]
    assert _p95(ttft_before) == pytest.approx(3_200, rel=0.10)


def test_canary_regression_splits_traffic_and_slows_the_canary_llm() -> None:
    records = _records(_run("canary-regression", rate=60, duration_s=300))
    (_, _, canary_start), _ = phases("canary-regression", START, 300)
    before = [r for r in records.values() if r["request_start"] < canary_start]
    during = [r for r in records.values() if r["request_start"] >= canary_start]
    assert all("rollout" not in r["labels"] for r in before)
    arms = Counter(r["labels"]["rollout"] for r in during)
    assert 0.2 <= arms["canary"] / len(during) <= 0.3
    canary = [r for r in during if r["labels"]["rollout"] == "canary"]
    stable = [r for r in during if r["labels"]["rollout"] == "stable"]
    assert {r["labels"]["version_id"] for r in canary} == {"v13"}
    assert "v13" not in {r["labels"]["version_id"] for r in stable}
    ratio = _p95([r["llm_ttft"] for r in canary]) / _p95([r["llm_ttft"] for r in stable])
    assert ratio == pytest.approx(CANARY_LLM_RATIO, abs=0.12)
    assert np.mean([r["accept"] for r in canary]) == pytest.approx(0.5, abs=0.03)
    assert np.mean([r["accept"] for r in stable]) == pytest.approx(ROUTING_SPECULATIVE.draft_accept_mean, abs=0.03)


def test_incident_slows_retrieval_of_one_tenant_in_the_middle() -> None:
    records = _records(_run("incident", rate=60, duration_s=300))
    bounds = {name: (lo, hi) for name, lo, hi in phases("incident", START, 300)}
    victim = incident_tenant(DEFAULT_TENANTS)

    def p95(tenant_is_victim: bool, phase: str) -> float:
        lo, hi = bounds[phase]
        return _p95(
            [
                r["retrieval"]
                for r in records.values()
                if lo <= r["request_start"] < hi and (r["labels"]["tenant_id"] == victim) == tenant_is_victim
            ]
        )

    assert 1.5 <= p95(True, "incident") / p95(True, "before") <= 2.0
    assert 0.85 <= p95(True, "after") / p95(True, "before") <= 1.15
    assert 0.85 <= p95(False, "incident") / p95(False, "before") <= 1.15


def test_steady_is_noise_only_with_several_tenants_and_versions() -> None:
    records = _records(_run("steady", rate=50, duration_s=60))
    tenants = Counter(r["labels"]["tenant_id"] for r in records.values())
    assert set(tenants) == set(DEFAULT_TENANTS)
    assert tenants["acme"] > tenants["知识库"]
    assert {r["labels"]["version_id"] for r in records.values()} == {"v11", "v12"}
    assert all("rollout" not in r["labels"] for r in records.values())


def test_generate_is_deterministic_ordered_and_valid() -> None:
    first = _run("canary-regression", rate=30, duration_s=20, seed=5)
    assert first == _run("canary-regression", rate=30, duration_s=20, seed=5)
    assert first != _run("canary-regression", rate=30, duration_s=20, seed=6)
    stamps = [ts for _, _, ts in first]
    assert stamps == sorted(stamps)
    assert stamps[0] >= START
    for key, value, ts in first:
        event = StageEvent.model_validate_json(value, strict=True)
        assert key == event.request_id.encode("utf-8")
        assert ts == pytest.approx(event.ts_ms + (event.duration_ms or 0.0), abs=1e-6)
        assert event.event_id is not None


def test_custom_tenants_and_unknown_scenario() -> None:
    messages = list(generate("steady", rate_rps=20, duration_s=10, tenants=["a", "ß-ü"], seed=1, start_ms=START))
    assert {orjson.loads(v)["tenant_id"] for _, v, _ in messages} == {"a", "ß-ü"}
    with pytest.raises(ValueError, match="unknown scenario"):
        list(generate("nope", rate_rps=1, duration_s=1, start_ms=START))
    with pytest.raises(ValueError, match="distinct"):
        list(generate("steady", rate_rps=1, duration_s=1, tenants=["a", "a"], start_ms=START))
