from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.dead_letter import DeadLetter
from schemas.decode import decode_stage_event
from schemas.events import INSTANT_STAGES, KNOWN_STAGES, MAX_TS_MS, MIN_TS_MS, RESERVED_TENANT, StageEvent
from streams.settings import CapsConfig

CAPS = CapsConfig()
FUZZ = settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WELL_KNOWN_ATTRS = {
    "prompt_tokens",
    "cached_tokens",
    "prompt_cache_hit",
    "draft_accept_rate",
    "rerank_top_k",
    "retrieval_cache_hit",
    "trace_id",
}
BASE_EVENT: dict[str, Any] = {
    "request_id": "req-1",
    "tenant_id": "acme",
    "stage": "retrieval",
    "ts_ms": 1_761_300_000_000.0,
    "duration_ms": 250.0,
    "version_id": "v1",
    "route": "main",
    "rollout": "stable",
    "fallback_level": 0,
    "event_id": "e1",
    "attrs": {"prompt_tokens": 10, "prompt_cache_hit": True, "draft_accept_rate": 0.5},
}


#: The worker's clock in these tests: after every valid time, so only the skew tests meet the future bound.
LATE_CLOCK_MS = MAX_TS_MS + 86_400_000


def decode(
    raw: bytes, key: bytes | None = b"req-1", kafka_ts: int | None = None, received_at: float = LATE_CLOCK_MS
) -> StageEvent | DeadLetter:
    return decode_stage_event(raw, key, "ttft.stage-events", 0, 0, kafka_ts, CAPS, received_at)


def reason(result: StageEvent | DeadLetter) -> str:
    return "ok" if isinstance(result, StageEvent) else result.reason_code


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


# --- oracle 1: invalid input -> a dead letter with the right reason, never an exception -------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


def assert_first_failing_reason(raw: bytes, result: StageEvent | DeadLetter) -> None:
    """The byte-level checks, in contract order, re-derived independently of the decoder."""
    if len(raw) > CAPS.max_event_bytes:
        assert reason(result) == "too_large"
        return
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        assert reason(result) == "not_utf8"
        return
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        assert reason(result) == "invalid_json"
        return
    assert reason(result) in {"ok", "schema", "invalid_json", "invalid_key"}


@FUZZ
@given(st.binary(max_size=10_000))
def test_random_bytes_never_raise_and_get_the_first_failing_reason(raw: bytes) -> None:
    assert_first_failing_reason(raw, decode(raw))


@FUZZ
@given(st.data())
def test_mutated_valid_events_never_raise(data: st.DataObject) -> None:
    raw = bytearray(orjson.dumps(BASE_EVENT))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[at]
    assert_first_failing_reason(bytes(raw), decode(bytes(raw)))


@FUZZ
@given(json_values)
def test_random_json_is_dead_lettered_as_schema_or_too_deep(value: Any) -> None:
    raw = orjson.dumps(value)
    result = decode(raw)
    if len(raw) > CAPS.max_event_bytes:
        assert reason(result) == "too_large"
    elif depth(value) > CAPS.max_json_depth:
        assert reason(result) == "invalid_json"
    else:
        assert reason(result) == "schema"


def _wrong_types(field: str) -> st.SearchStrategy[Any]:
    strings = st.text(max_size=10)
    numbers = st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    containers = st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    if field in ("ts_ms", "duration_ms"):
        # "12" is not a number, true is not 1
        return strings | st.booleans() | containers | strings.map(lambda s: str(len(s)))
    if field == "fallback_level":
        return strings | st.booleans() | containers | st.floats(allow_nan=False, allow_infinity=False)
    if field == "attrs":
        return strings | numbers | st.booleans() | st.lists(st.integers(), max_size=2)
    return numbers | st.booleans() | containers  # the string fields


@FUZZ
@given(st.data())
def test_wrong_types_are_schema_errors_naming_the_field(data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(set(BASE_EVENT) - {"schema_version"})))
    event = {**BASE_EVENT, field: data.draw(_wrong_types(field))}
    result = decode(json.dumps(event).encode())  # json: orjson refuses integers beyond 64 bits
    assert isinstance(result, DeadLetter)
    assert result.reason_code == "schema"
    assert field in result.detail


@FUZZ
@given(
    st.sampled_from(["ts_ms", "duration_ms", "attrs.draft_accept_rate", "attrs.custom"]),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "nan", "inf"]),
)
def test_nan_and_infinity_are_invalid_json(field: str, literal: str) -> None:
    event: dict[str, Any] = json.loads(json.dumps(BASE_EVENT))
    marker = "__MARKER__"
    if field.startswith("attrs."):
        event["attrs"][field.split(".", 1)[1]] = marker
    else:
        event[field] = marker
    raw = json.dumps(event).replace(f'"{marker}"', literal).encode()
    assert reason(decode(raw)) == "invalid_json"


@FUZZ
@given(
    st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False) | st.integers(max_value=-1),
    st.sampled_from([*sorted(set(KNOWN_STAGES) - INSTANT_STAGES), "guardrail"]),
)
def test_negative_durations_are_schema_errors(duration: float, stage: str) -> None:
    result = decode(json.dumps({**BASE_EVENT, "stage": stage, "duration_ms": duration}).encode())
    assert isinstance(result, DeadLetter) and result.reason_code == "schema"
    assert "duration_ms" in result.detail


@FUZZ
@given(st.integers(CAPS.max_event_bytes + 1, 5 * CAPS.max_event_bytes), st.booleans())
def test_oversize_is_too_large_before_anything_else(size: int, valid_json: bool) -> None:
    head = orjson.dumps({**BASE_EVENT, "attrs": {"note": ""}})
    raw = head[:-3] + b"x" * (size - len(head)) + head[-3:] if valid_json else b"\xff" * size
    assert len(raw) == size
    letter = decode(raw)
    assert isinstance(letter, DeadLetter) and letter.reason_code == "too_large"
    assert letter.original_length == size and len(letter.original) == CAPS.dead_letter_bytes


@FUZZ
@given(st.integers(CAPS.max_json_depth - 1, 1_100), st.booleans())
def test_deep_nesting_is_invalid_json_and_never_overflows_the_stack(levels: int, use_lists: bool) -> None:
    inner = b"[" * levels + b"1" + b"]" * levels if use_lists else b'{"a":' * levels + b"1" + b"}" * levels
    raw = b'{"request_id":"req-1","tenant_id":"acme","stage":"x","ts_ms":1761300000000,"attrs":{"n":' + inner + b"}}"
    result = decode(raw)
    total_depth = 2 + levels
    if len(raw) > CAPS.max_event_bytes:
        assert reason(result) == "too_large"
    elif total_depth > CAPS.max_json_depth:
        assert reason(result) == "invalid_json"
    else:
        assert reason(result) == "schema"  # shallow enough, but attrs values must be scalars


@FUZZ
@given(st.integers(-(10**13), 10**13), st.integers(0, 10**13) | st.none())
def test_only_times_in_the_future_of_the_workers_clock_are_dead_lettered(offset: int, kafka_ts: int | None) -> None:
    """The event ends ``offset`` ms before the worker's clock; the producer's Kafka timestamp is ignored."""
    end = BASE_EVENT["ts_ms"] + BASE_EVENT["duration_ms"]
    result = decode(orjson.dumps(BASE_EVENT), kafka_ts=kafka_ts, received_at=end + offset)
    assert reason(result) == ("timestamp_skew" if -offset > CAPS.skew_limit_ms else "ok")


# --- oracle 2: valid but odd input is stored exactly ----------------------------------------------

odd_text = st.text(min_size=1, max_size=40) | st.sampled_from(
    [
        "'; DROP TABLE requests; --",
        'a"b\\c',
        "\x00\x01\x1f\x7f",
        "租户-🚀",
        "\u2028\u2029",
        " ",
        "NaN",
        "null",
    ]
)


def _bounded(max_size: int) -> st.SearchStrategy[str]:
    return odd_text.filter(lambda s: len(s) <= max_size) | st.text(min_size=1, max_size=max_size)


attr_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
custom_attrs = st.dictionaries(
    st.text(min_size=1, max_size=16).filter(lambda k: k not in WELL_KNOWN_ATTRS), attr_scalars, max_size=5
)
well_known_attrs = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": st.integers(0, 10_000_000),
        "cached_tokens": st.integers(0, 10_000_000),
        "prompt_cache_hit": st.booleans(),
        "draft_accept_rate": st.floats(0, 1) | st.sampled_from([0, 1]),
        "rerank_top_k": st.integers(0, 100_000),
        "retrieval_cache_hit": st.booleans(),
        "trace_id": _bounded(128),
    },
)


@st.composite
def odd_valid_events(draw: st.DrawFn) -> dict[str, Any]:
    stage = draw(st.sampled_from(KNOWN_STAGES) | st.from_regex(r"[a-z][a-z0-9_]{0,47}", fullmatch=True))
    event: dict[str, Any] = {
        "request_id": draw(_bounded(128)),
        "tenant_id": draw(_bounded(64).filter(lambda t: t != RESERVED_TENANT)),
        "stage": stage,
        "ts_ms": draw(st.floats(MIN_TS_MS, MAX_TS_MS) | st.integers(MIN_TS_MS, MAX_TS_MS)),
    }
    if stage not in INSTANT_STAGES:
        event["duration_ms"] = draw(st.floats(0, 86_400_000) | st.integers(0, 86_400_000))
    optional = {
        "schema_version": st.just(1),
        "version_id": _bounded(128),
        "route": _bounded(64),
        "rollout": st.sampled_from(["stable", "canary"]),
        "fallback_level": st.integers(0, 100),
        "event_id": _bounded(128),
        "attrs": st.builds(lambda a, b: {**a, **b}, well_known_attrs, custom_attrs),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            event[name] = draw(strategy)
    return event


@FUZZ
@given(odd_valid_events(), st.sampled_from(["orjson", "ascii", "spaced"]))
def test_valid_odd_events_round_trip_exactly(event: dict[str, Any], encoding: str) -> None:
    if encoding == "orjson":
        raw = orjson.dumps(event)
    else:
        raw = json.dumps(event, ensure_ascii=encoding == "ascii", indent=1 if encoding == "spaced" else None).encode()
    result = decode(raw, event["request_id"].encode("utf-8"), kafka_ts=int(event["ts_ms"]))
    assert isinstance(result, StageEvent), getattr(result, "detail", "")
    dumped = result.model_dump(exclude_unset=True)
    attrs = dumped.pop("attrs", None)
    assert dumped == {k: v for k, v in event.items() if k != "attrs"}
    assert attrs == event.get("attrs")
    for name in ("request_id", "tenant_id", "version_id", "route", "event_id"):
        if name in event:
            assert getattr(result, name) == event[name]  # the exact string, code point for code point
    for name in ("ts_ms", "duration_ms"):
        if name in event:
            value = getattr(result, name)
            assert math.isfinite(value) and value == event[name]
    # and what the pipeline re-serialises decodes to the same event again
    again = decode(orjson.dumps(result.model_dump(mode="json", exclude_unset=True)), event["request_id"].encode())
    assert again == result


# --- duplicate keys (issue 14) --------------------------------------------------------------------


def _event_bytes(**extra: Any) -> bytes:
    event = {"request_id": "r1", "tenant_id": "acme", "stage": "retrieval", "ts_ms": 1_761_300_000_000.0}
    return orjson.dumps({**event, "duration_ms": 10.0, **extra})


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (_event_bytes()[:-1] + b',"tenant_id":"globex"}', "tenant_id"),
        (_event_bytes()[:-1] + b', "ts_ms" : 1761300000001}', "ts_ms"),
        (_event_bytes(attrs={"trace_id": "a:b"})[:-2] + b',"trace_id":"c"}}', "trace_id"),
        (_event_bytes()[:-1] + b',"attrs":{"x":1},"attrs":{"x":2}}', "attrs"),
    ],
)
def test_duplicate_keys_are_refused(raw: bytes, key: str) -> None:
    result = decode_stage_event(raw, b"r1", "t", 0, 0, None, CAPS, LATE_CLOCK_MS)
    assert isinstance(result, DeadLetter) and result.reason_code == "duplicate_key", result
    assert repr(key) in result.detail


def test_colons_inside_strings_are_not_duplicates() -> None:
    raw = _event_bytes(route="a:b:c", attrs={"trace_id": "x:y", "note": 'k:v, "q":1'})
    assert isinstance(decode_stage_event(raw, b"r1", "t", 0, 0, None, CAPS, LATE_CLOCK_MS), StageEvent)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    name=st.sampled_from(["request_id", "tenant_id", "stage", "ts_ms", "duration_ms", "route"]),
    spaces=st.sampled_from(["", " ", "\n\t"]),
    colon_text=st.text(alphabet=":ab", max_size=6),
)
def test_any_repeated_top_level_key_is_refused(name: str, spaces: str, colon_text: str) -> None:
    base = _event_bytes(route="r" + colon_text)
    raw = base[:-1] + f',{spaces}"{name}"{spaces}:{spaces}"x"{spaces}}}'.encode()
    result = decode_stage_event(raw, b"r1", "t", 0, 0, None, CAPS, LATE_CLOCK_MS)
    assert isinstance(result, DeadLetter) and result.reason_code == "duplicate_key"
