"""The dead-letter envelope: one message of ``ttft.dead-letter`` and one row of ``dead_letters``.

A dead letter keeps enough to diagnose and replay a bad input message: the original bytes (truncated
past ``caps.dead_letter_bytes``, with the full length and the sha256 of the full original), where it
came from (topic, partition, offset, Kafka timestamp), a reason code from a closed set and a bounded,
human-readable detail. Field names are the ``dead_letters`` columns; times are epoch ms.

In JSON ``original`` is standard (RFC 4648, padded) base64: read a topic message back with
``DeadLetter.model_validate_json(value)``, whose ``model_dump()`` gives the raw bytes again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

DeadLetterReason = Literal[
    "invalid_json",
    "schema",
    "too_large",
    "tenant_mismatch",
    "timestamp_skew",
    "invalid_key",
    "not_utf8",
    "duplicate_key",
    "conflicting_duplicate",
    "too_many_events",
    "store_rejected",
    "otlp_decode",
    "missing_tenant",
    "no_first_chunk",  # no longer produced (such LLM spans are forwarded as llm_unmeasured); stored rows keep it
    "tenant_not_allowed",  # an event on a tenant's bound topic claiming another tenant, or a bound tenant's elsewhere
]
#: The closed set of reason codes, in contract order.
DEAD_LETTER_REASONS: Final[tuple[str, ...]] = get_args(DeadLetterReason)
MAX_DETAIL_CHARS: Final = 512
#: Identifiers read from a bad message are kept only up to this length.
MAX_ID_CHARS: Final = 256


def _from_base64(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("original must be standard base64") from exc
    return value


Base64Bytes = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]


class DeadLetter(BaseModel):
    """An input message that failed decoding or validation, with its diagnosis."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason_code: DeadLetterReason
    detail: str = Field(max_length=MAX_DETAIL_CHARS, description="Human-readable cause, naming the field.")
    original: Base64Bytes = Field(description="The original value bytes, truncated past caps.dead_letter_bytes.")
    original_length: int = Field(ge=0, description="Length of the full original value in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the full original value.")
    source_topic: str = Field(description="Topic the message was read from.")
    source_partition: int = Field(ge=0, description="Its partition.")
    source_offset: int = Field(ge=0, description="Its offset.")
    kafka_timestamp: int | None = Field(None, description="Its Kafka timestamp, epoch ms.")
    request_id: str | None = Field(None, max_length=MAX_ID_CHARS, description="When it could be read.")
    tenant_id: str | None = Field(None, max_length=MAX_ID_CHARS, description="When it could be read.")
    received_at: float = Field(description="Epoch ms at which the pipeline read the message.")
    trace_id: str | None = Field(
        None, max_length=MAX_ID_CHARS, description="An OTLP span's trace id (32 lowercase hex), when one failed."
    )
    span_id: str | None = Field(
        None,
        max_length=MAX_ID_CHARS,
        description="An OTLP span's span id (16 lowercase hex): one message may dead-letter several spans.",
    )

    @property
    def truncated(self) -> bool:
        """True when ``original`` holds only a prefix of the message."""
        return len(self.original) < self.original_length


def bounded_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def make_dead_letter(
    reason_code: DeadLetterReason,
    detail: str,
    raw_value: bytes,
    *,
    topic: str,
    partition: int,
    offset: int,
    kafka_timestamp_ms: int | None,
    max_original_bytes: int,
    received_at_ms: float,
    request_id: str | None = None,
    tenant_id: str | None = None,
    trace_id: str | None = None,
    span_id: str | None = None,
) -> DeadLetter:
    """Build a dead letter for ``raw_value``; bounds the detail, the ids and the kept bytes.

    Also used outside decoding (the join dead-letters a ``tenant_mismatch`` with the original bytes).

    Built without validation: every field is bounded and typed here, and a flood of bad input is where the
    cost matters (validating cost ~20 µs of a dead letter's ~30, against ~3 µs to decode a good event).
    tests/unit/test_dead_letter*.py check the result validates the same and equals ``model_construct``'s.
    """
    return _construct(
        reason_code=reason_code,
        detail=bounded_text(detail, MAX_DETAIL_CHARS),
        original=bytes(raw_value[:max_original_bytes]),
        original_length=len(raw_value),
        sha256=hashlib.sha256(raw_value).hexdigest(),
        source_topic=str(topic),
        source_partition=max(int(partition), 0),
        source_offset=max(int(offset), 0),
        kafka_timestamp=None if kafka_timestamp_ms is None else int(kafka_timestamp_ms),
        request_id=None if request_id is None else bounded_text(request_id, MAX_ID_CHARS),
        tenant_id=None if tenant_id is None else bounded_text(tenant_id, MAX_ID_CHARS),
        received_at=float(received_at_ms),
        trace_id=None if trace_id is None else bounded_text(trace_id, MAX_ID_CHARS),
        span_id=None if span_id is None else bounded_text(span_id, MAX_ID_CHARS),
    )


_object_setattr = object.__setattr__


def _construct_fast(**values: Any) -> DeadLetter:
    """``DeadLetter.model_construct(**values)`` for a call that sets every field: the instance attributes it
    would set, without its per-field loop (5.5 µs of a flood's dead letter, against ~1.5 µs here)."""
    letter = DeadLetter.__new__(DeadLetter)
    _object_setattr(letter, "__dict__", values)
    _object_setattr(letter, "__pydantic_fields_set__", set(values))
    _object_setattr(letter, "__pydantic_extra__", None)
    _object_setattr(letter, "__pydantic_private__", None)
    return letter


def _fast_construct_holds() -> bool:
    """Whether ``model_construct`` sets nothing more than :func:`_construct_fast` does for this model (no
    aliases, defaults left to fill, post-init hook, private attributes or root model): else it is used."""
    fields = DeadLetter.__pydantic_fields__.values()
    return (
        not DeadLetter.__pydantic_post_init__
        and not DeadLetter.__private_attributes__
        and not DeadLetter.__pydantic_root_model__
        and DeadLetter.model_config.get("extra") != "allow"
        and all(f.alias is None and f.validation_alias is None for f in fields)
    )


_construct: Callable[..., DeadLetter] = _construct_fast if _fast_construct_holds() else DeadLetter.model_construct
