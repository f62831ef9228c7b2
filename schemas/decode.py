"""Raw Kafka message -> :class:`StageEvent`, or a :class:`DeadLetter` saying why not.

The checks run in contract order and the first failure wins:

1. ``too_large``: the value is longer than ``caps.max_event_bytes`` (nothing is parsed);
2. ``not_utf8`` / ``invalid_json``: strict JSON (orjson: no NaN/Infinity, no lone surrogates, no BOM),
   nested no deeper than ``caps.max_json_depth``; ``duplicate_key``: an object repeats a key (JSON
   leaves that undefined; orjson would keep the last silently);
3. ``schema``: the strict :class:`StageEvent` model; the detail names the failing fields;
4. ``invalid_key``: the Kafka key is missing or is not the request_id in UTF-8;
5. ``timestamp_skew``: the event ends more than ``caps.skew_limit_ms`` after the worker's clock (or the
   broker's append time, for a ``LogAppendTime`` topic); times in the past are never refused.

:func:`decode_stage_event` never raises, whatever the bytes: one bad event must never stop the pipeline.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson
from pydantic import ValidationError
from pydantic_core import SchemaValidator

from schemas.dead_letter import DeadLetter, DeadLetterReason, bounded_text, make_dead_letter
from schemas.events import INSTANT_STAGES, KNOWN_ATTRS, MAX_TS_MS, MIN_TS_MS, RESERVED_TENANT, StageEvent, bound_attrs
from streams.settings import CapsConfig

_MAX_ERRORS_IN_DETAIL: Final = 3
#: What StageEvent.model_validate calls, without its Python wrapper (the same validation, once per event).
_validate: Final = StageEvent.__pydantic_validator__.validate_python
#: The same validation straight from the bytes (one pass of pydantic-core's parser, no intermediate dict).
_validate_json: Final = StageEvent.__pydantic_validator__.validate_json
_KNOWN_ATTRS: Final = KNOWN_ATTRS


def _unchecked_validator() -> SchemaValidator | None:
    """:class:`StageEvent`'s validator without its two Python validators (the model's ``_cross_field`` and
    the attrs' ``bounded_attrs``): the same core schema, model class and config otherwise, so it makes the
    same StageEvent instances. None if the schema is not shaped as expected (then the fast path validates in
    full)."""
    schema: Any = StageEvent.__pydantic_core_schema__
    try:
        if schema["type"] != "function-after" or schema["schema"]["type"] != "model":
            return None
        model = dict(schema["schema"])
        fields_schema = dict(model["schema"])
        fields = dict(fields_schema["fields"])
        attrs_field = dict(fields["attrs"])
        default = dict(attrs_field["schema"])
        nullable = dict(default["schema"])
        if nullable["schema"]["type"] != "function-after" or nullable["schema"]["schema"]["type"] != "typed-dict":
            return None
        nullable["schema"] = nullable["schema"]["schema"]
        default["schema"], attrs_field["schema"], fields["attrs"] = nullable, default, attrs_field
        fields_schema["fields"], model["schema"] = fields, fields_schema
        return SchemaValidator(model, model.get("config"))
    except (KeyError, TypeError):
        return None


_unchecked = _unchecked_validator()
#: The fast path's validation: the field checks only; the rules of the two Python validators run inline.
_validate_unchecked: Final = _validate_json if _unchecked is None else _unchecked.validate_json
_MAX_MSG_CHARS: Final = 120


def decode_stage_event(
    raw_value: bytes | None,
    raw_key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    kafka_timestamp_ms: int | None,
    caps: CapsConfig,
    received_at_ms: float,
    *,
    append_time_ms: float | None = None,
) -> StageEvent | DeadLetter:
    """Decode and validate one message of ``ttft.stage-events``; never raises.

    ``received_at_ms`` is the wall-clock time of reading, injected so the function stays pure.
    ``append_time_ms``: the broker's append time when the topic uses ``LogAppendTime`` (then the clock
    future times are judged by); the producer's own ``CreateTime`` is never trusted for that.
    """
    # The common case, a valid event, in one pass: the checks of the full path below in the same order
    # (size, one-pass validation and its colon count, key, skew), inlined, returning only an event every one
    # of them accepts. Anything else, an exception included, is decided by the full path, which classifies
    # it from the start; only a dead letter pays for both.
    schema_failed = False
    if type(raw_value) is bytes and raw_key is not None:
        try:
            last_caps, context, max_bytes, skew_limit = _last_bounds
            if last_caps is not caps:
                context, max_bytes, skew_limit = _bounds(caps)
            if len(raw_value) <= max_bytes:
                # The model's field checks without its two Python validators (called back from pydantic-core,
                # ~0.6 us per event); their rules, events.bound_attrs and events.cross_field_error, run here.
                try:
                    event: StageEvent = _validate_unchecked(raw_value)
                except ValidationError:
                    # Both validators left out run after the fields validated: the full validator fails too, so
                    # the full path need not try the bytes in one pass again (a flood of invalid events).
                    schema_failed = _unchecked is not None
                    raise
                # The field values in one read: every attribute read of a model goes through its __getattr__ hook.
                fields = event.__dict__
                attrs = fields["attrs"]
                duration = fields["duration_ms"]
                if attrs is not None and (len(attrs) > context["max_attrs_keys"] or not attrs.keys() <= _KNOWN_ATTRS):
                    bound_attrs(attrs, context["max_attrs_keys"], context["max_attrs_bytes"])  # ValueError: full path
                stage = fields["stage"]
                clock = append_time_ms if append_time_ms is not None and append_time_ms >= 0 else received_at_ms
                if (
                    raw_value.count(b":") <= len(event.__pydantic_fields_set__) + (0 if attrs is None else len(attrs))
                    and raw_key == fields["request_id"].encode()
                    and fields["ts_ms"] + (duration or 0.0) - clock <= skew_limit
                    # cross_field_error's rules, inlined: a duration exactly for span stages, not the reserved tenant
                    and (duration is None) is (stage in INSTANT_STAGES)
                    and fields["tenant_id"] != RESERVED_TENANT
                ):
                    return event
        except Exception:  # the full path decides (and dead-letters a failure)
            pass
    return _decode_in_steps(
        raw_value,
        raw_key,
        topic,
        partition,
        offset,
        kafka_timestamp_ms,
        caps,
        received_at_ms,
        append_time_ms,
        schema_failed,
    )


#: Confluent's Schema Registry serializers prefix the JSON with a magic byte 0 and a 4-byte schema id.
_REGISTRY_MAGIC = 0


def _framing_hint(value: bytes) -> str:
    """What a value that is not JSON looks like when a known producer framing explains it, else nothing."""
    if len(value) > 5 and value[0] == _REGISTRY_MAGIC and value[5:6] in (b"{", b"["):
        schema_id = int.from_bytes(value[1:5], "big")
        return (
            f" (it starts with a Schema Registry header, magic byte 0 and schema id {schema_id}: the topic takes "
            "plain JSON, so send the JSON text itself (e.g. StringSerializer), not the registry serializer's output)"
        )
    return ""


def _decode_in_steps(
    raw_value: bytes | None,
    raw_key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    kafka_timestamp_ms: int | None,
    caps: CapsConfig,
    received_at_ms: float,
    append_time_ms: float | None,
    schema_failed: bool = False,
) -> StageEvent | DeadLetter:
    """:func:`decode_stage_event`, every check in contract order: the first failure names the reason.
    ``schema_failed``: the bytes are known to fail the schema (the one-pass attempt is skipped)."""
    parsed: Any = None

    def dead(reason: DeadLetterReason, detail: str) -> DeadLetter:
        request_id = tenant_id = None
        if isinstance(parsed, StageEvent):
            request_id, tenant_id = parsed.request_id, parsed.tenant_id
        elif isinstance(parsed, dict):
            rid, tid = parsed.get("request_id"), parsed.get("tenant_id")
            request_id = rid if isinstance(rid, str) else None
            tenant_id = tid if isinstance(tid, str) else None
        return make_dead_letter(
            reason,
            detail,
            raw_value or b"",
            topic=topic,
            partition=partition,
            offset=offset,
            kafka_timestamp_ms=kafka_timestamp_ms,
            max_original_bytes=caps.dead_letter_bytes,
            received_at_ms=received_at_ms,
            request_id=request_id,
            tenant_id=tenant_id,
        )

    try:
        # A tombstone (None) or a memoryview must dead-letter like any other value, not raise.
        if raw_value is None:
            return dead("invalid_json", "value is null (a Kafka tombstone): every event is a JSON object")
        if type(raw_value) is not bytes:
            raw_value = bytes(raw_value)
        if len(raw_value) > caps.max_event_bytes:
            return dead("too_large", f"value is {len(raw_value)} bytes, the cap is {caps.max_event_bytes}")
        parsed = None if schema_failed else _valid_at_once(raw_value, caps)
        if parsed is not None:
            return _checked(parsed, raw_key, received_at_ms, append_time_ms, caps, dead)
        try:
            parsed = orjson.loads(raw_value)
        except orjson.JSONDecodeError as exc:
            utf8_error = _utf8_error(raw_value)
            if utf8_error is not None:
                return dead("not_utf8", f"value is not valid UTF-8: {utf8_error}")
            return dead("invalid_json", f"value is not strict JSON: {_short(str(exc))}{_framing_hint(raw_value)}")
        duplicate = duplicate_key(raw_value, parsed)
        if duplicate is not None:
            return dead("duplicate_key", f"JSON object repeats the key {_short(repr(duplicate))}")
        try:
            event: StageEvent = _validate(parsed, context=_context(caps))
        except ValidationError as exc:
            # A valid StageEvent nests at most 2 deep, so depth only needs checking on failure.
            depth = _json_depth(parsed, caps.max_json_depth + 1)
            if depth > caps.max_json_depth:
                return dead("invalid_json", f"JSON nests deeper than {caps.max_json_depth} levels")
            if not isinstance(parsed, dict):
                return dead("schema", f"value must be a JSON object, not {_json_type(parsed)}")
            return dead("schema", schema_error_summary(exc))
        return _checked(event, raw_key, received_at_ms, append_time_ms, caps, dead)
    except Exception as exc:  # a bug here must not stop the pipeline: dead-letter and keep going
        try:
            return dead("schema", f"unexpected decode failure: {type(exc).__name__}: {_short(str(exc))}")
        except Exception:
            return make_dead_letter(
                "schema",
                "unexpected decode failure",
                b"",
                topic=str(topic),
                partition=0,
                offset=0,
                kafka_timestamp_ms=None,
                max_original_bytes=0,
                received_at_ms=0.0,
            )


def _valid_at_once(raw: bytes, caps: CapsConfig) -> StageEvent | None:
    """The event when the bytes hold a valid one with no repeated key, validated in one pass from the bytes;
    None when anything is wrong or uncertain: the caller then takes the step-by-step path, whose checks
    (strict JSON by orjson, duplicate keys, the schema) classify the failure as before.

    pydantic-core's parser is laxer than orjson in two ways, both covered: it reads NaN and Infinity (no
    field accepts them, so validation fails), and it keeps integers past 64 bits (``bounded_attrs`` turns
    them into floats, as orjson reads them). Like orjson it keeps the last of repeated keys, so the colon
    count of :func:`duplicate_key` runs here too, on the keys the event set."""
    try:
        event: StageEvent = _validate_json(raw, context=_context(caps))
    except ValidationError:
        return None
    attrs = event.attrs
    if raw.count(b":") > len(event.model_fields_set) + (len(attrs) if attrs is not None else 0):
        return None  # a colon in a string, or a repeated key: the full check decides
    return event


def _checked(
    event: StageEvent,
    raw_key: bytes | None,
    received_at_ms: float,
    append_time_ms: float | None,
    caps: CapsConfig,
    dead: Any,
) -> StageEvent | DeadLetter:
    """The checks after the schema: the Kafka key, then the future skew."""
    if raw_key is None:
        return dead("invalid_key", "Kafka key is missing; it must be the request_id in UTF-8")  # type: ignore[no-any-return]
    if raw_key != event.request_id.encode("utf-8"):
        return dead("invalid_key", f"Kafka key {_short(repr(bytes(raw_key)))} is not the request_id")  # type: ignore[no-any-return]
    skew = future_skew(event, received_at_ms, append_time_ms)
    if skew > caps.skew_limit_ms:
        clock = "the broker's append time" if append_time_ms is not None else "the worker's clock"
        return dead(  # type: ignore[no-any-return]
            "timestamp_skew",
            f"the event ends {skew:.0f} ms after {clock} (limit {caps.skew_limit_ms} ms; past times are never refused)",
        )
    return event


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def duplicate_key(raw: bytes, parsed: Any) -> str | None:
    """The first key some JSON object of ``raw`` repeats, else None (orjson keeps the last silently).

    Cheap first: every key is followed by its own ``:`` outside strings, so when ``raw`` holds no more
    colons than the event's top-level and ``attrs`` keys, no key can repeat (one ``bytes.count``, about
    0.2 us). Only otherwise (a colon inside a string, keys nested elsewhere, or a real duplicate) is the
    value parsed again with the standard library, which reports every object's pairs. A value that is
    not an object fails the schema anyway and is not checked.
    """
    if type(parsed) is not dict:
        return None
    attrs = parsed.get("attrs")
    keys = len(parsed) + (len(attrs) if type(attrs) is dict else 0)
    if raw.count(b":") <= keys:
        return None
    try:
        json.loads(raw, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as dup:
        return dup.key
    except (ValueError, RecursionError):  # orjson accepted it; a deeper nesting fails later as invalid_json
        return None
    return None


def future_skew(event: StageEvent, received_at_ms: float, append_time_ms: float | None = None) -> float:
    """How far (ms) the event ends after a clock its producer does not control (<= 0: not in the future).

    The clock is the broker's append time when known, else the worker's clock at reading. Only the future
    is bounded: backfills and replays legitimately carry times long past.
    """
    clock = append_time_ms if append_time_ms is not None and append_time_ms >= 0 else received_at_ms
    return event.ts_ms + (event.duration_ms or 0.0) - clock


def schema_error_summary(exc: ValidationError) -> str:
    """Compact, bounded summary of a validation error: ``field: message; field: message (+N more)``."""
    errors = exc.errors(include_url=False, include_context=False, include_input=True)
    parts = []
    for err in errors[:_MAX_ERRORS_IN_DETAIL]:
        loc = ".".join(str(p) for p in err["loc"]) or "event"
        msg = _short(err["msg"].removeprefix("Value error, "))
        if loc == "ts_ms" and err["type"] in ("greater_than_equal", "less_than_equal"):
            msg += _ts_unit_hint(err.get("input"))
        parts.append(f"{loc}: {msg}")
    more = len(errors) - _MAX_ERRORS_IN_DETAIL
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


#: The units a ts_ms outside the contract's range is most often in, with the factor that makes milliseconds.
_TS_UNITS: Final = (("seconds", 1e3), ("microseconds", 1e-3), ("nanoseconds", 1e-6))


def _ts_unit_hint(value: object) -> str:
    """`` (… looks like seconds …)`` when ``value`` is in range in another unit of epoch time, else nothing."""
    if type(value) not in (int, float):
        return ""
    for unit, factor in _TS_UNITS:
        if MIN_TS_MS <= value * factor <= MAX_TS_MS:  # type: ignore[operator]
            return f" ({value} looks like {unit} since the epoch; ts_ms is in milliseconds)"
    return ""


#: The caps object of the last call and its context: a worker passes the same (frozen) object for every
#: event, so one identity check finds it (the reference keeps its id from reuse).
_last_context: tuple[CapsConfig | None, dict[str, int]] = (None, {})


def _context(caps: CapsConfig) -> dict[str, int]:
    global _last_context
    last_caps, ctx = _last_context
    if last_caps is not caps:
        ctx = {"max_attrs_keys": caps.max_attrs_keys, "max_attrs_bytes": caps.max_attrs_bytes}
        _last_context = (caps, ctx)
    return ctx


#: The same for the fast path of :func:`decode_stage_event`: the caps object, its context and the two bounds
#: it reads, so that no settings attribute is read per event.
_last_bounds: tuple[CapsConfig | None, dict[str, int], int, int] = (None, {}, 0, 0)


def _bounds(caps: CapsConfig) -> tuple[dict[str, int], int, int]:
    global _last_bounds
    _last_bounds = (caps, _context(caps), caps.max_event_bytes, caps.skew_limit_ms)
    return _last_bounds[1:]


def _json_depth(value: Any, stop: int) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), counted no further than ``stop``.

    The cut-off also bounds the recursion: orjson accepts 1024 levels, more than Python's stack allows.
    """
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return 0
    if stop <= 1:
        return 1
    deepest = 0
    for child in children:
        if isinstance(child, dict | list):
            deepest = max(deepest, _json_depth(child, stop - 1))
            if deepest + 1 >= stop:
                break
    return deepest + 1


def _utf8_error(raw: bytes) -> str | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{exc.reason} at byte {exc.start} (0x{raw[exc.start]:02x})"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _short(text: str) -> str:
    return bounded_text(text, _MAX_MSG_CHARS)
