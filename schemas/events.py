"""The input contract: one JSON object per stage of a request, on topic ``ttft.stage-events``.

Validation is strict: no type coercion (``"12"`` is not a number, ``1`` is not a boolean), no NaN or
Infinity, bounded strings and attrs. The Kafka key is the ``request_id`` in UTF-8.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationInfo, field_validator, model_validator

SCHEMA_VERSION: Final = 1
STAGE_NAME_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,47}")
INSTANT_STAGES: Final = frozenset({"request_start", "first_token"})
RESERVED_TENANT: Final = "__other__"
DEFAULT_MAX_ATTRS_KEYS: Final = 32
DEFAULT_MAX_ATTRS_BYTES: Final = 2_048

Number = StrictInt | StrictFloat
AttrScalar = StrictStr | StrictInt | StrictFloat | StrictBool | None


class StageAttrs(BaseModel):
    """Optional, bounded attributes of a stage event. Unknown keys must be JSON scalars."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True, allow_inf_nan=False)

    prompt_tokens: Annotated[StrictInt, Field(ge=0, le=10_000_000)] | None = None
    cached_tokens: Annotated[StrictInt, Field(ge=0, le=10_000_000)] | None = None
    prompt_cache_hit: StrictBool | None = None
    draft_accept_rate: Annotated[Number, Field(ge=0, le=1)] | None = None
    rerank_top_k: Annotated[StrictInt, Field(ge=0, le=100_000)] | None = None
    retrieval_cache_hit: StrictBool | None = None
    trace_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None

    @model_validator(mode="after")
    def _bounded(self, info: ValidationInfo) -> StageAttrs:
        extra = self.model_extra or {}
        ctx = info.context or {}
        max_keys = int(ctx.get("max_attrs_keys", DEFAULT_MAX_ATTRS_KEYS))
        max_bytes = int(ctx.get("max_attrs_bytes", DEFAULT_MAX_ATTRS_BYTES))
        if len(self.model_fields_set) + len(extra) > max_keys:
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


class StageEvent(BaseModel):
    """One timing event of one stage of one request (DESIGN.md, the contract).

    Span stages carry ``ts_ms`` (start, epoch ms) and ``duration_ms``; the instants ``request_start``
    and ``first_token`` carry only ``ts_ms``.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: Literal[1] = 1
    request_id: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    tenant_id: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    stage: StrictStr
    ts_ms: Number
    duration_ms: Annotated[Number, Field(ge=0, le=86_400_000)] | None = None
    version_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] = "unknown"
    rollout: Literal["stable", "canary"] | None = None
    route: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    fallback_level: Annotated[StrictInt, Field(ge=0, le=100)] | None = None
    event_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None
    attrs: StageAttrs | None = None

    @field_validator("stage")
    @classmethod
    def _stage_name(cls, v: str) -> str:
        if not STAGE_NAME_RE.fullmatch(v):
            raise ValueError("stage must match [a-z][a-z0-9_]{0,47}")
        return v

    @field_validator("tenant_id")
    @classmethod
    def _tenant(cls, v: str) -> str:
        if v == RESERVED_TENANT:
            raise ValueError(f"tenant_id {RESERVED_TENANT!r} is reserved")
        return v

    @field_validator("ts_ms")
    @classmethod
    def _ts(cls, v: float) -> float:
        # Year 2000 .. 2200 in epoch ms: catches seconds or microseconds sent by mistake.
        if not 946_684_800_000 <= v <= 7_258_118_400_000:
            raise ValueError("ts_ms must be epoch milliseconds")
        return v

    @model_validator(mode="after")
    def _duration_rule(self) -> StageEvent:
        if self.stage in INSTANT_STAGES:
            if self.duration_ms is not None:
                raise ValueError(f"{self.stage} is an instant and takes no duration_ms")
        elif self.duration_ms is None:
            raise ValueError(f"duration_ms is required for span stage {self.stage}")
        return self

    @property
    def is_instant(self) -> bool:
        return self.stage in INSTANT_STAGES

    def dedup_key(self) -> tuple[Any, ...]:
        """Identity of an event for duplicate detection (DESIGN.md: event_id, else ts and duration)."""
        if self.event_id is not None:
            return (self.stage, "id", self.event_id)
        return (self.stage, "ts", float(self.ts_ms), None if self.duration_ms is None else float(self.duration_ms))
