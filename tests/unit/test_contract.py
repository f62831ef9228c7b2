from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from schemas.dead_letter import DEAD_LETTER_REASONS, DeadLetter, make_dead_letter
from schemas.decode import decode_stage_event
from schemas.events import INSTANT_STAGES, KNOWN_STAGES, StageEvent
from schemas.export import JSONSCHEMA_DIR, main, rendered_schemas, stale_files
from schemas.records import RequestRecord
from streams.settings import CapsConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
STAGE_EVENTS = EXAMPLES / "stage-events"
VALID = sorted((STAGE_EVENTS / "valid").glob("*.json"))
INVALID = sorted(p for p in (STAGE_EVENTS / "invalid").iterdir() if p.suffix in (".json", ".bin"))
CAPS = CapsConfig()
RECEIVED_AT = 1_761_300_009_000.0

# What a JSON Schema cannot say: integral floats are integers there, and attrs' byte budget.
NOT_EXPRESSIBLE_IN_JSON_SCHEMA = {"schema__float_as_int.json", "schema__attrs_too_many_bytes.json"}


def _schema_validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((JSONSCHEMA_DIR / name).read_text(encoding="utf-8")))


def _key_of(raw: bytes) -> bytes | None:
    try:
        request_id = orjson.loads(raw)["request_id"]
    except Exception:
        return None
    return request_id.encode() if isinstance(request_id, str) else None


def _decode(raw: bytes, key: bytes | None, kafka_ts: int | None = None) -> StageEvent | DeadLetter:
    return decode_stage_event(raw, key, "ttft.stage-events", 2, 41, kafka_ts, CAPS, RECEIVED_AT)


def _expected_reason(path: Path) -> str:
    return path.name.split("__", 1)[0]


def test_examples_exist_for_every_stage_and_reason_producible_from_bytes() -> None:
    stages = {orjson.loads(p.read_bytes())["stage"] for p in VALID}
    assert set(KNOWN_STAGES) <= stages
    assert stages - set(KNOWN_STAGES), "a custom stage example is missing"
    reasons = {_expected_reason(p) for p in INVALID}
    assert reasons == {"invalid_json", "schema", "too_large", "not_utf8", "duplicate_key"}
    assert reasons <= set(DEAD_LETTER_REASONS)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_example_decodes_and_is_stored_exactly(path: Path) -> None:
    raw = path.read_bytes()
    event = _decode(raw, _key_of(raw))
    assert isinstance(event, StageEvent), getattr(event, "detail", "")
    original = orjson.loads(raw)
    dumped = event.model_dump(exclude_unset=True)
    attrs = dumped.pop("attrs", None)
    assert dumped == {k: v for k, v in original.items() if k != "attrs"}
    assert attrs == original.get("attrs")
    assert event.is_instant == (event.stage in INSTANT_STAGES)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_example_passes_the_exported_json_schema(path: Path) -> None:
    _schema_validator("stage_event.json").validate(json.loads(path.read_bytes()))


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_example_is_dead_lettered_with_its_reason(path: Path) -> None:
    raw = path.read_bytes()
    letter = _decode(raw, _key_of(raw))
    assert isinstance(letter, DeadLetter)
    assert letter.reason_code == _expected_reason(path), letter.detail
    assert 0 < len(letter.detail) <= 512
    assert letter.original_length == len(raw)
    assert letter.original == raw[: CAPS.dead_letter_bytes]
    assert letter.sha256 == hashlib.sha256(raw).hexdigest()
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "ttft.stage-events",
        2,
        41,
    )
    assert letter.received_at == RECEIVED_AT


@pytest.mark.parametrize(
    "path",
    [p for p in INVALID if _expected_reason(p) == "schema" and p.name not in NOT_EXPRESSIBLE_IN_JSON_SCHEMA],
    ids=lambda p: p.stem,
)
def test_schema_invalid_example_fails_the_exported_json_schema(path: Path) -> None:
    assert not _schema_validator("stage_event.json").is_valid(json.loads(path.read_bytes()))


def test_schema_detail_names_the_field() -> None:
    letter = _decode((STAGE_EVENTS / "invalid" / "schema__negative_duration.json").read_bytes(), b"req-0001")
    assert isinstance(letter, DeadLetter)
    assert letter.detail.startswith("duration_ms: ")
    assert letter.request_id == "req-0001" and letter.tenant_id == "acme"


def test_key_must_be_the_request_id() -> None:
    raw = (STAGE_EVENTS / "valid" / "quotes_in_ids.json").read_bytes()
    request_id = orjson.loads(raw)["request_id"]
    assert isinstance(_decode(raw, request_id.encode()), StageEvent)
    for key in (None, b"", b"other", request_id.encode() + b" "):
        letter = _decode(raw, key)
        assert isinstance(letter, DeadLetter) and letter.reason_code == "invalid_key"
        assert letter.request_id == request_id


TS = 1_761_300_000_000  # minimal_instant.json's ts_ms


@pytest.mark.parametrize(
    ("received_at", "append_time", "kafka_ts", "reason"),
    [
        (TS, None, None, None),
        (TS - CAPS.skew_limit_ms, None, None, None),  # exactly at the bound
        (TS - CAPS.skew_limit_ms - 1, None, None, "timestamp_skew"),  # ahead of the worker's clock
        (TS - CAPS.skew_limit_ms - 1, None, TS, "timestamp_skew"),  # the producer's CreateTime is not trusted
        (TS - 10 * 86_400_000, TS - 1_000, None, None),  # the broker appended it in time (a replay today)
        (TS, TS - CAPS.skew_limit_ms - 1, None, "timestamp_skew"),  # ahead of the broker's append time
        (TS + 365 * 86_400_000, None, TS - 86_400_000, None),  # a year in the past: never refused
    ],
)
def test_timestamp_skew_only_bounds_the_future(
    received_at: float, append_time: float | None, kafka_ts: int | None, reason: str | None
) -> None:
    raw = (STAGE_EVENTS / "valid" / "minimal_instant.json").read_bytes()
    result = decode_stage_event(
        raw, b"r", "ttft.stage-events", 2, 41, kafka_ts, CAPS, received_at, append_time_ms=append_time
    )
    if reason is None:
        assert isinstance(result, StageEvent), result
    else:
        assert isinstance(result, DeadLetter) and result.reason_code == reason
        assert "past times are never refused" in result.detail


def test_dead_letter_truncates_the_original_but_hashes_all_of_it() -> None:
    raw = (STAGE_EVENTS / "invalid" / "too_large__oversize_attrs.json").read_bytes()
    letter = _decode(raw, None)
    assert isinstance(letter, DeadLetter)
    assert len(letter.original) == CAPS.dead_letter_bytes < letter.original_length == len(raw)
    assert letter.truncated
    assert letter.sha256 == hashlib.sha256(raw).hexdigest()


def test_dead_letter_json_round_trips_with_standard_base64() -> None:
    raw = bytes(range(256))
    letter = make_dead_letter(
        "not_utf8",
        "x" * 2000,
        raw,
        topic="ttft.stage-events",
        partition=0,
        offset=7,
        kafka_timestamp_ms=None,
        max_original_bytes=100,
        received_at_ms=RECEIVED_AT,
    )
    assert len(letter.detail) == 512
    data = orjson.loads(letter.model_dump_json())
    assert base64.b64decode(data["original"], validate=True) == raw[:100]
    assert DeadLetter.model_validate_json(letter.model_dump_json()) == letter
    _schema_validator("dead_letter.json").validate(data)


@pytest.mark.parametrize("path", sorted((EXAMPLES / "dead-letter" / "valid").glob("*.json")), ids=lambda p: p.stem)
def test_dead_letter_examples_validate(path: Path) -> None:
    data: dict[str, Any] = json.loads(path.read_bytes())
    letter = DeadLetter.model_validate(data)
    assert letter.reason_code == path.name.split("__", 1)[0]
    _schema_validator("dead_letter.json").validate(data)


@pytest.mark.parametrize("path", sorted((EXAMPLES / "requests" / "valid").glob("*.json")), ids=lambda p: p.stem)
def test_request_record_examples_validate(path: Path) -> None:
    data: dict[str, Any] = json.loads(path.read_bytes())
    record = RequestRecord.model_validate(data)
    assert record.model_dump(mode="json") == data
    _schema_validator("request_record.json").validate(data)


def test_exported_json_schemas_are_current() -> None:
    assert stale_files() == [], "run: python -m schemas.export"
    assert main(["--check"]) == 0


def test_export_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    assert main(["--dir", str(tmp_path)]) == 0
    assert main(["--check", "--dir", str(tmp_path)]) == 0
    name = next(iter(rendered_schemas()))
    (tmp_path / name).write_text("{}\n", encoding="utf-8")
    assert main(["--check", "--dir", str(tmp_path)]) == 1


def test_schema_registry_framing_is_named_in_the_detail() -> None:
    """Confluent's registry serializers put a magic byte 0 and a schema id before the JSON: the letter says so."""
    letter = _decode((STAGE_EVENTS / "invalid" / "invalid_json__schema_registry_framing.bin").read_bytes(), b"r")
    assert isinstance(letter, DeadLetter) and letter.reason_code == "invalid_json"
    assert "Schema Registry header, magic byte 0 and schema id 7" in letter.detail
    plain = _decode(b"\x00{}", b"r")
    assert isinstance(plain, DeadLetter) and "Schema Registry" not in plain.detail


@pytest.mark.parametrize(
    ("name", "unit"), [("schema__ts_in_seconds.json", "seconds"), ("schema__ts_in_nanoseconds.json", "nanoseconds")]
)
def test_a_ts_ms_in_another_unit_is_named_in_the_detail(name: str, unit: str) -> None:
    """The commonest unit mistake (epoch seconds, or a monotonic clock's nanoseconds) is said in the letter."""
    raw = (STAGE_EVENTS / "invalid" / name).read_bytes()
    letter = _decode(raw, _key_of(raw))
    assert isinstance(letter, DeadLetter) and letter.reason_code == "schema"
    assert f"looks like {unit} since the epoch; ts_ms is in milliseconds" in letter.detail


def test_a_tombstone_is_dead_lettered_as_a_null_value() -> None:
    letter = _decode(None, b"req-0001")  # type: ignore[arg-type]
    assert isinstance(letter, DeadLetter) and letter.reason_code == "invalid_json"
    assert letter.detail == "value is null (a Kafka tombstone): every event is a JSON object"
    assert (letter.original, letter.original_length) == (b"", 0)
