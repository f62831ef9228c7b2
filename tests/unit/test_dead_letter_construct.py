"""make_dead_letter builds without validation (the cost of a flood of bad input): what it builds must be
exactly what validation gives, through the JSON a topic carries and the dict a store row comes from."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.dead_letter import DEAD_LETTER_REASONS, DeadLetter, make_dead_letter
from streams.app.join_fold import _dead_letter_json

CASES: list[dict[str, Any]] = [
    {"raw_value": b"", "kafka_timestamp_ms": None},
    {"raw_value": b"\xff{not json" * 500, "kafka_timestamp_ms": 1_764_000_000_123, "request_id": "r" * 999},
    {
        "raw_value": b'{"a": 1}',
        "kafka_timestamp_ms": -1,
        "tenant_id": "acme",
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
    },
    {"raw_value": memoryview(b"view").tobytes(), "kafka_timestamp_ms": 5, "partition": -1, "offset": -3},
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reason", (*DEAD_LETTER_REASONS[:3], "too_many_events"))
def test_a_built_dead_letter_is_what_validation_gives(case: dict[str, Any], reason: Any) -> None:
    args = {
        "topic": "ttft.stage-events",
        "partition": 2,
        "offset": 7,
        "received_at_ms": 1_764_000_000_000,
        "max_original_bytes": 64,
        **case,
    }
    raw = args.pop("raw_value")
    built = make_dead_letter(reason, "d" * 900, raw, **args)
    assert DeadLetter.model_validate_json(built.model_dump_json()) == built
    assert DeadLetter.model_validate(built.model_dump()) == built
    assert built.model_dump_json() == DeadLetter.model_validate(built.model_dump()).model_dump_json()
    assert isinstance(built.received_at, float) and len(built.detail) <= 512 and len(built.original) <= 64
    # The join writes it with the serializer's bytes (streams/app/join_fold.py): the same JSON.
    assert _dead_letter_json(built) == built.model_dump_json().encode()


@pytest.mark.parametrize("case", CASES)
def test_the_fast_construction_sets_what_model_construct_sets(case: dict[str, Any]) -> None:
    """make_dead_letter skips model_construct's per-field loop (schemas.dead_letter._construct_fast): the
    instance must carry the same attributes, fields set, extra and private state."""
    from schemas import dead_letter

    assert dead_letter._construct is dead_letter._construct_fast, "the model grew what the fast path skips"
    args = {"topic": "t", "partition": 1, "offset": 2, "received_at_ms": 3.0, "max_original_bytes": 64, **case}
    raw = args.pop("raw_value")
    built = make_dead_letter("schema", "d", raw, **args)
    slow = DeadLetter.model_construct(**built.__dict__)
    for attribute in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
        assert getattr(built, attribute) == getattr(slow, attribute), attribute
    assert built == slow and hash(built) == hash(slow)
