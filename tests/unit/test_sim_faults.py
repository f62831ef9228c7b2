from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from schemas.events import StageEvent
from streams.sim import ErrorRates, generate, generate_with_truth

START = 1_767_225_600_000.0
REQUIRED = ("request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token")
RATES = ErrorRates(duplicate=0.05, missing_stage=0.05, orphan=0.05, malformed=0.02)


def _read(
    messages: list[tuple[bytes, bytes, float]],
) -> tuple[list[int], list[int], dict[str, dict[str, Any]]]:
    """An independent reading of the messages: validate, de-duplicate, group by request."""
    malformed: list[int] = []
    duplicates: list[int] = []
    seen: set[tuple[str, str, str | None]] = set()
    requests: dict[str, dict[str, Any]] = {}
    for index, (key, value, _) in enumerate(messages):
        try:
            event = StageEvent.model_validate_json(value, strict=True)
        except ValidationError:
            malformed.append(index)
            continue
        assert key == event.request_id.encode()
        identity = (event.request_id, event.stage, event.event_id)
        if identity in seen:
            duplicates.append(index)
            continue
        seen.add(identity)
        request = requests.setdefault(event.request_id, {"stages": {}, "instants": {}, "tenant": event.tenant_id})
        if event.duration_ms is None:
            request["instants"][event.stage] = event.ts_ms
        else:
            request["stages"][event.stage] = request["stages"].get(event.stage, 0.0) + event.duration_ms
    return malformed, duplicates, requests


def test_ground_truth_agrees_with_an_independent_reading_of_the_messages() -> None:
    messages, truth = generate_with_truth("steady", rate_rps=40, duration_s=60, seed=3, start_ms=START, errors=RATES)
    malformed, duplicates, requests = _read(messages)
    assert malformed == truth.malformed
    assert duplicates == truth.duplicates
    assert set(requests) == set(truth.requests)
    for request_id, seen in requests.items():
        expected = truth.requests[request_id]
        present = set(seen["stages"]) | set(seen["instants"])
        missing = [s for s in REQUIRED if s not in present]
        status = "orphan" if "request_start" not in present else "missing_stage" if missing else "complete"
        assert expected["status"] == status
        assert expected["missing_stages"] == missing
        assert expected["tenant_id"] == seen["tenant"]
        assert expected["stages"] == seen["stages"]
        instants = seen["instants"]
        if "request_start" in instants and "first_token" in instants:
            assert expected["ttft_ms"] == instants["first_token"] - instants["request_start"]
        else:
            assert expected["ttft_ms"] is None
        if status == "complete":
            assert 0.0 <= expected["other_ms"] < 150.0


def test_fault_rates_are_roughly_the_configured_ones() -> None:
    messages, truth = generate_with_truth("steady", rate_rps=80, duration_s=60, seed=4, start_ms=START, errors=RATES)
    statuses = [r["status"] for r in truth.requests.values()]
    n = len(statuses)
    assert statuses.count("orphan") / n == pytest.approx(0.05, abs=0.015)
    # orphan wins over missing_stage, so a few missing-stage requests count as orphans
    assert statuses.count("missing_stage") / n == pytest.approx(0.05 * 0.95, abs=0.015)
    valid = len(messages) - len(truth.malformed) - len(truth.duplicates)
    assert len(truth.duplicates) / valid == pytest.approx(0.05, abs=0.01)
    assert len(truth.malformed) / valid == pytest.approx(0.02, abs=0.006)
    assert sum(r["duplicate_events"] for r in truth.requests.values()) == len(truth.duplicates)


def test_malformed_messages_carry_their_expected_reason() -> None:
    messages, truth = generate_with_truth(
        "steady", rate_rps=40, duration_s=60, seed=5, start_ms=START, errors=ErrorRates(malformed=0.05)
    )
    reasons = set(truth.malformed_reasons.values())
    assert reasons == {"invalid_json", "schema"}
    for index in truth.malformed:
        key, value, _ = messages[index]
        assert key.startswith(b"malformed-")
        if truth.malformed_reasons[index] == "invalid_json":
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(value)
        else:
            assert isinstance(orjson.loads(value), dict)


def test_faults_leave_the_clean_traffic_unchanged() -> None:
    clean = list(generate("incident", rate_rps=30, duration_s=30, seed=8, start_ms=START))
    noisy, truth = generate_with_truth(
        "incident",
        rate_rps=30,
        duration_s=30,
        seed=8,
        start_ms=START,
        errors=ErrorRates(duplicate=0.1, malformed=0.1),
    )
    dropped = set(truth.malformed) | set(truth.duplicates)
    assert [m for i, m in enumerate(noisy) if i not in dropped] == clean


def test_clean_truth_is_all_complete_with_small_non_negative_other_ms() -> None:
    messages, truth = generate_with_truth("seed-story", rate_rps=30, duration_s=40, seed=2, start_ms=START)
    assert list(generate("seed-story", rate_rps=30, duration_s=40, seed=2, start_ms=START)) == messages
    assert not truth.malformed and not truth.duplicates
    for record in truth.requests.values():
        assert record["status"] == "complete" and record["missing_stages"] == []
        assert record["ttft_ms"] == record["first_token_at"] - record["started_at"]
        assert 0.0 <= record["other_ms"] < 150.0


def test_error_rates_parse() -> None:
    assert ErrorRates.parse("dup=0.01, missing=0.02,orphan=0.03,malformed=0.004") == ErrorRates(0.01, 0.02, 0.03, 0.004)
    assert ErrorRates.parse("missing_stage=0.5") == ErrorRates(missing_stage=0.5)
    assert not ErrorRates.parse("").any
    with pytest.raises(ValueError, match="unknown error kind"):
        ErrorRates.parse("lost=0.1")
    with pytest.raises(ValueError, match="within"):
        ErrorRates.parse("dup=2")
    with pytest.raises(ValueError, match="name=fraction"):
        ErrorRates.parse("dup")
