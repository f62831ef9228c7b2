"""The input contract: one JSON object per stage of a request, on topic ``ttft.stage-events``.

Validation is strict: no type coercion (``"12"`` is not a number, ``true`` is not 1), no NaN or
Infinity, bounded strings and attrs. The Kafka key is the ``request_id`` in UTF-8. Raw bytes are
decoded by :func:`schemas.decode.decode_stage_event`, which routes anything invalid to a dead letter.

Numbers are validated as floats (a JSON integer is accepted and becomes a float): every time in the
pipeline is a float of epoch milliseconds, and the bounds below keep them exact (< 2**53).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict

from schemas import vocabulary
from schemas.vocabulary import KNOWN_STAGES as KNOWN_STAGES  # re-exported: the contract's names
from schemas.vocabulary import RESERVED_TENANT as RESERVED_TENANT
from schemas.vocabulary import STAGE_NAME_PATTERN
from schemas.vocabulary import STAGE_NAME_RE as STAGE_NAME_RE

SCHEMA_VERSION: Final = 1
INSTANT_STAGES: Final = frozenset(vocabulary.INSTANT_STAGES)
DEFAULT_MAX_ATTRS_KEYS: Final = 32
DEFAULT_MAX_ATTRS_BYTES: Final = 2_048
#: Epoch-millisecond bounds of ``ts_ms`` (2000-01-01 .. 2200-01-01): catches seconds or microseconds.
MIN_TS_MS: Final = 946_684_800_000
MAX_TS_MS: Final = 7_258_118_400_000
MAX_DURATION_MS: Final = 86_400_000

#: A finite JSON number (integer or float), never a boolean or a string.
Number = StrictFloat
AttrScalar = StrictStr | StrictInt | StrictFloat | StrictBool | None


#: A well-known attr may be absent; JSON Schema readers see that as a null default, as before.
_ABSENT: Final = Field(json_schema_extra={"default": None})


@with_config(
    ConfigDict(
        strict=True,
        extra="allow",
        allow_inf_nan=False,
        json_schema_extra={
            "maxProperties": DEFAULT_MAX_ATTRS_KEYS,
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
        },
    )
)
class StageAttrs(TypedDict, total=False):
    """Optional, bounded attributes of a stage event. Unknown keys must be JSON scalars.

    Bounded by caps.max_attrs_keys keys and caps.max_attrs_bytes bytes (keys plus string values).
    """

    # A validated ``attrs`` is a plain dict of the keys the event sent, not a nested model: building a model
    # per event cost about 4 us of the join's per-event budget (issue 13). The bounds: `bounded_attrs`.
    prompt_tokens: Annotated[Annotated[StrictInt, Field(ge=0, le=10_000_000)] | None, _ABSENT]
    cached_tokens: Annotated[Annotated[StrictInt, Field(ge=0, le=10_000_000)] | None, _ABSENT]
    prompt_cache_hit: Annotated[StrictBool | None, _ABSENT]
    draft_accept_rate: Annotated[Annotated[StrictFloat, Field(ge=0, le=1)] | None, _ABSENT]
    rerank_top_k: Annotated[Annotated[StrictInt, Field(ge=0, le=100_000)] | None, _ABSENT]
    retrieval_cache_hit: Annotated[StrictBool | None, _ABSENT]
    trace_id: Annotated[
        Annotated[StrictStr, Field(min_length=1, max_length=128)] | None,
        Field(description="Links the request to its OpenTelemetry trace.", json_schema_extra={"default": None}),
    ]


#: The well-known attrs (typed and checked); any other key is a custom attr, a bounded JSON scalar.
KNOWN_ATTRS: Final = frozenset(StageAttrs.__optional_keys__)


def bounded_attrs(attrs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """The bounds of ``attrs`` (:func:`bound_attrs`), from the validation context (set by the decoder from
    CapsConfig), else the defaults."""
    ctx = info.context or _NO_CONTEXT
    return bound_attrs(
        attrs, ctx.get("max_attrs_keys", DEFAULT_MAX_ATTRS_KEYS), ctx.get("max_attrs_bytes", DEFAULT_MAX_ATTRS_BYTES)
    )


def bound_attrs(attrs: dict[str, Any], max_keys: int, max_bytes: int) -> dict[str, Any]:
    """At most ``max_keys`` keys, custom values JSON scalars (finite numbers), and the custom keys plus their
    string values within ``max_bytes``; raises ValueError. An integer past 64 bits becomes a float, as
    orjson reads it."""
    if len(attrs) > max_keys:
        raise ValueError(f"attrs has more than {max_keys} keys")
    size = 0
    for key, value in attrs.items():
        if key in KNOWN_ATTRS:
            continue
        kind = type(value)
        if kind is str:
            size += len(key) + len(value)
        elif kind is float:
            if not math.isfinite(value):
                raise ValueError(f"attrs.{key} must be finite")
            size += len(key) + 8
        elif kind is int:
            if not _INT64_MIN <= value <= _UINT64_MAX:  # past 64 bits a JSON integer is a float (as orjson reads it)
                attrs[key] = float(value)
            size += len(key) + 8
        elif kind is bool or value is None:
            size += len(key) + 8
        else:
            raise ValueError(f"attrs.{key} must be a JSON scalar")
    if size > max_bytes:
        raise ValueError(f"attrs exceeds {max_bytes} bytes")
    return attrs


def cross_field_error(tenant_id: str, stage: str, duration_ms: float | None) -> str | None:
    """Which cross-field rule of a stage event is broken (its message), or None: the reserved tenant, and a
    duration for span stages only."""
    if tenant_id == RESERVED_TENANT:
        return f"tenant_id {RESERVED_TENANT!r} is reserved"
    if stage in INSTANT_STAGES:
        if duration_ms is not None:
            return f"{stage} is an instant and takes no duration_ms"
    elif duration_ms is None:
        return f"duration_ms is required for span stage {stage}"
    return None


_NO_CONTEXT: Final[dict[str, int]] = {}
_INT64_MIN: Final = -(2**63)
_UINT64_MAX: Final = 2**64 - 1


# The cross-field rule of `_cross_field`, for JSON Schema users (a null duration counts as absent).
_SPAN_RULE: Final[dict[str, Any]] = {
    "if": {"properties": {"stage": {"enum": sorted(INSTANT_STAGES)}}},
    "then": {"properties": {"duration_ms": {"type": "null"}}},
    "else": {"required": ["duration_ms"], "properties": {"duration_ms": {"type": "number"}}},
}


class StageEvent(BaseModel):
    """One timing event of one stage of one request (docs/design.md, the contract).

    Span stages carry ``ts_ms`` (start, epoch ms) and ``duration_ms``; the instants ``request_start``
    and ``first_token`` carry only ``ts_ms``. Kafka key: the request_id in UTF-8.
    """

    # Field checks are pydantic-core constraints (fast, and visible in the exported JSON Schema); the
    # cross-field rules are the one Python validator, `_cross_field`.

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        # Only the keys repeat from event to event; most string values (ids) are new each time, and caching
        # them costs more than it saves. The repeated ones (tenant, version, route) are interned by the join.
        cache_strings="keys",
        json_schema_extra={"allOf": [_SPAN_RULE]},
    )

    schema_version: Annotated[StrictInt, Field(ge=SCHEMA_VERSION, le=SCHEMA_VERSION)] = SCHEMA_VERSION
    request_id: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    tenant_id: Annotated[
        StrictStr, Field(min_length=1, max_length=64, json_schema_extra={"not": {"const": RESERVED_TENANT}})
    ]
    stage: Annotated[
        StrictStr,
        Field(
            pattern=f"^{STAGE_NAME_PATTERN}$",
            description="A known stage (" + ", ".join(KNOWN_STAGES) + ") or a custom stage name.",
        ),
    ]
    ts_ms: Annotated[
        Number,
        Field(ge=MIN_TS_MS, le=MAX_TS_MS, description="Epoch ms: a span's start, or the instant itself."),
    ]
    duration_ms: Annotated[Number, Field(ge=0, le=MAX_DURATION_MS)] | None = Field(
        None, description="Required for span stages, absent for request_start and first_token."
    )
    version_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] = "unknown"
    rollout: Literal["stable", "canary"] | None = Field(
        None, description="Which arm of a gray release served the request: stable or canary."
    )
    route: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    fallback_level: Annotated[StrictInt, Field(ge=0, le=100)] | None = Field(None, description="0 = no degradation.")
    event_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = Field(
        None, description="Duplicates of the same (request_id, stage, event_id) count once."
    )
    attrs: Annotated[StageAttrs, AfterValidator(bounded_attrs)] | None = None

    @model_validator(mode="after")
    def _cross_field(self) -> StageEvent:
        error = cross_field_error(self.tenant_id, self.stage, self.duration_ms)
        if error is not None:
            raise ValueError(error)
        return self

    @property
    def is_instant(self) -> bool:
        """True for ``request_start`` and ``first_token``."""
        return self.stage in INSTANT_STAGES

    def dedup_key(self) -> tuple[Any, ...]:
        """Identity of an event for duplicate detection (docs/design.md: event_id, else ts and duration)."""
        if self.event_id is not None:
            return (self.stage, "id", self.event_id)
        return (
            self.stage,
            "ts",
            float(self.ts_ms),
            None if self.duration_ms is None else float(self.duration_ms),
        )
