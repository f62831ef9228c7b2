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
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    model_validator,
)

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


class StageAttrs(BaseModel):
    """Optional, bounded attributes of a stage event. Unknown keys must be JSON scalars.

    Bounded by caps.max_attrs_keys keys and caps.max_attrs_bytes bytes (keys plus string values).
    """

    # The bounds come from the validation context (set by the decoder from CapsConfig), else defaults.
    model_config = ConfigDict(
        strict=True,
        extra="allow",
        frozen=True,
        allow_inf_nan=False,
        json_schema_extra={
            "maxProperties": DEFAULT_MAX_ATTRS_KEYS,
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
        },
    )

    prompt_tokens: Annotated[StrictInt, Field(ge=0, le=10_000_000)] | None = None
    cached_tokens: Annotated[StrictInt, Field(ge=0, le=10_000_000)] | None = None
    prompt_cache_hit: StrictBool | None = None
    draft_accept_rate: Annotated[StrictFloat, Field(ge=0, le=1)] | None = None
    rerank_top_k: Annotated[StrictInt, Field(ge=0, le=100_000)] | None = None
    retrieval_cache_hit: StrictBool | None = None
    trace_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = Field(
        None, description="Links the request to its OpenTelemetry trace."
    )

    @model_validator(mode="after")
    def _bounded(self, info: ValidationInfo) -> StageAttrs:
        # The dunder attributes behind model_extra and model_fields_set (the same objects, without the
        # property calls: this runs for every event with attrs).
        extra = self.__pydantic_extra__ or {}
        ctx = info.context or {}
        max_keys = int(ctx.get("max_attrs_keys", DEFAULT_MAX_ATTRS_KEYS))
        max_bytes = int(ctx.get("max_attrs_bytes", DEFAULT_MAX_ATTRS_BYTES))
        if len(self.__pydantic_fields_set__) + len(extra) > max_keys:
            raise ValueError(f"attrs has more than {max_keys} keys")
        size = 0
        for key, value in extra.items():
            if not isinstance(value, str | int | float | bool) and value is not None:
                raise ValueError(f"attrs.{key} must be a JSON scalar")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"attrs.{key} must be finite")
            size += len(key) + (len(value) if isinstance(value, str) else 8)
        if size > max_bytes:
            raise ValueError(f"attrs exceeds {max_bytes} bytes")
        return self


# The cross-field rule of `_cross_field`, for JSON Schema users (a null duration counts as absent).
_SPAN_RULE: Final[dict[str, Any]] = {
    "if": {"properties": {"stage": {"enum": sorted(INSTANT_STAGES)}}},
    "then": {"properties": {"duration_ms": {"type": "null"}}},
    "else": {"required": ["duration_ms"], "properties": {"duration_ms": {"type": "number"}}},
}


class StageEvent(BaseModel):
    """One timing event of one stage of one request (DESIGN.md, the contract).

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
    attrs: StageAttrs | None = None

    @model_validator(mode="after")
    def _cross_field(self) -> StageEvent:
        if self.tenant_id == RESERVED_TENANT:
            raise ValueError(f"tenant_id {RESERVED_TENANT!r} is reserved")
        if self.stage in INSTANT_STAGES:
            if self.duration_ms is not None:
                raise ValueError(f"{self.stage} is an instant and takes no duration_ms")
        elif self.duration_ms is None:
            raise ValueError(f"duration_ms is required for span stage {self.stage}")
        return self

    @property
    def is_instant(self) -> bool:
        """True for ``request_start`` and ``first_token``."""
        return self.stage in INSTANT_STAGES

    def dedup_key(self) -> tuple[Any, ...]:
        """Identity of an event for duplicate detection (DESIGN.md: event_id, else ts and duration)."""
        if self.event_id is not None:
            return (self.stage, "id", self.event_id)
        return (
            self.stage,
            "ts",
            float(self.ts_ms),
            None if self.duration_ms is None else float(self.duration_ms),
        )
