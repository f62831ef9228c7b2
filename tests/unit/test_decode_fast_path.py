"""The one-pass validation from the bytes (``_valid_at_once``) gives the event the step-by-step path gives
(orjson, the duplicate-key check, then the schema), and steps aside whenever it could differ."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import decode
from schemas.events import StageEvent
from streams.settings import CapsConfig

EXAMPLES = Path(decode.__file__).parent / "examples"
CAPS = CapsConfig()
BASE = {"request_id": "r1", "tenant_id": "acme", "stage": "retrieval", "ts_ms": 1_796_000_000_000, "duration_ms": 5}


def _step_by_step(raw: bytes) -> StageEvent | None:
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if decode.duplicate_key(raw, parsed) is not None:
        return None
    try:
        return decode._validate(parsed, context=decode._context(CAPS))  # type: ignore[no-any-return]
    except Exception:
        return None


def _all_examples() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*.json") if "stage" in str(p))


@pytest.mark.parametrize("path", _all_examples(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_gets_the_same_event_or_the_full_check(path: Path) -> None:
    raw = path.read_bytes()
    fast = decode._valid_at_once(raw, CAPS)
    if fast is not None:
        assert fast == _step_by_step(raw)


@pytest.mark.parametrize(
    "attrs",
    [
        b'{"x": 123456789012345678901234567890}',
        b'{"x": -123456789012345678901234567890}',
        b'{"x": 18446744073709551615}',
        b'{"x": -9223372036854775808}',
    ],
)
def test_integers_past_64_bits_become_floats_as_orjson_reads_them(attrs: bytes) -> None:
    raw = orjson.dumps(BASE)[:-1] + b',"attrs":' + attrs + b"}"
    fast = decode._valid_at_once(raw, CAPS)
    assert fast is not None and fast == _step_by_step(raw)
    assert fast.attrs is not None and type(fast.attrs["x"]) is type(orjson.loads(attrs)["x"])
    orjson.dumps(fast.attrs)  # a record carrying it can always be written


@pytest.mark.parametrize(
    "raw",
    [
        b'{"request_id":"r1","request_id":"r2","tenant_id":"acme","stage":"retrieval","ts_ms":1796000000000,"duration_ms":5}',
        b'{"request_id":"r1","tenant_id":"acme","stage":"retrieval","ts_ms":1796000000000,"duration_ms":NaN}',
        b'{"request_id":"a:b","tenant_id":"acme","stage":"retrieval","ts_ms":1796000000000,"duration_ms":5}',
    ],
)
def test_repeated_keys_nan_and_colons_in_strings_take_the_full_check(raw: bytes) -> None:
    assert decode._valid_at_once(raw, CAPS) is None


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["prompt_tokens", "cached_tokens", "prompt_cache_hit", "custom", "k2", "trace_id"]),
        st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=20), st.none()),
        max_size=4,
    ),
    st.sampled_from(["request_start", "retrieval", "llm_ttft", "my_stage"]),
    st.one_of(st.none(), st.floats(min_value=0, max_value=1e7, allow_nan=False)),
)
def test_generated_events_agree_with_the_step_by_step_path(attrs: dict, stage: str, duration: float | None) -> None:
    event: dict[str, object] = {**BASE, "stage": stage, "attrs": attrs}
    if duration is None:
        event.pop("duration_ms")
    else:
        event["duration_ms"] = duration
    try:
        raw = orjson.dumps(event)
    except TypeError:
        return
    fast = decode._valid_at_once(raw, CAPS)
    if fast is not None:
        assert fast == _step_by_step(raw)
    full = decode.decode_stage_event(raw, b"r1", "t", 0, 0, None, CAPS, 1_797_000_000_000.0)
    slow = _step_by_step(raw)
    assert (full == slow) if slow is not None else not isinstance(full, StageEvent)


# --- decode_stage_event's inlined fast path returns what the checks in contract order return ----------------

CLOCK_MS = 1_796_000_100_000.0


Message = tuple[bytes, bytes | None, float | None]


@st.composite
def raw_messages(draw: st.DrawFn) -> Message:
    event: dict[str, object] = {**BASE, "request_id": draw(st.sampled_from(["r1", "r:1", "ré"]))}
    event["ts_ms"] = CLOCK_MS + draw(st.sampled_from([-10_000.0, 0.0, 290_000.0, 299_995.0, 300_001.0, 9e6]))
    if draw(st.booleans()):
        event["attrs"] = draw(
            st.dictionaries(
                st.sampled_from(["prompt_tokens", "trace_id", "custom", "c:olon"]),
                st.one_of(st.integers(-5, 2**63 - 1), st.text(max_size=8), st.none(), st.booleans()),
                max_size=3,
            )
        )
    if draw(st.booleans()):
        event["tenant_id"] = draw(st.sampled_from(["", "__other__", "t" * 65, "ok"]))
    # The cross-field rules (checked inline on the fast path): a duration exactly for span stages.
    event["stage"] = draw(st.sampled_from(["retrieval", "request_start", "first_token", "my_stage"]))
    if draw(st.booleans()):
        event.pop("duration_ms")
    if draw(st.integers(0, 4)) == 0:  # past the attrs' key count or byte budget (bounded inline)
        event["attrs"] = {f"k{i}": "v" * draw(st.sampled_from([1, 600])) for i in range(draw(st.sampled_from([3, 40])))}
    if draw(st.integers(0, 4)) == 0:  # fails the fields' schema (the one-pass attempt is then skipped)
        field, bad = draw(st.sampled_from([("duration_ms", -1.0), ("ts_ms", "soon"), ("version_id", 7), ("x", 1)]))
        event[field] = bad
    raw = orjson.dumps(event)
    if draw(st.integers(0, 8)) == 0:
        raw = draw(st.sampled_from([raw[:-1], b"\xff" + raw, raw.replace(b"5", b"NaN", 1)]))  # no JSON or UTF-8
    if draw(st.integers(0, 4)) == 0:
        raw = raw.replace(b'"stage"', b'"stage":"x","stage"', 1)  # a repeated key
    if draw(st.integers(0, 6)) == 0:
        raw = raw + b" " * CAPS.max_event_bytes  # too large
    key = draw(st.sampled_from([None, b"r1", b"r:1", "ré".encode(), b"other"]))
    append_time = draw(st.sampled_from([None, -1.0, CLOCK_MS, CLOCK_MS + 600_000.0]))
    return raw, key, append_time


@settings(max_examples=800, deadline=None)
@given(raw_messages())
def test_the_fast_path_decides_as_the_checks_in_contract_order(message: Message) -> None:
    raw, key, append_time = message
    args = (raw, key, "ttft.stage-events", 1, 7, 123, CAPS, CLOCK_MS)
    assert decode.decode_stage_event(*args, append_time_ms=append_time) == decode._decode_in_steps(*args, append_time)
