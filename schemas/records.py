"""The joined request record: one row of ``requests`` and one message of ``ttft.requests``.

Missing stage values are ``None`` (NULL), never 0. Times are epoch milliseconds (floats) in the record and
``DateTime64(3, 'UTC')`` in ClickHouse.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RequestStatus = Literal["complete", "missing_stage", "no_first_chunk", "timed_out", "orphan"]
RecallMode = Literal["parallel", "serial", "single", "none"]

#: Status precedence: the first that matches wins (docs/design.md, join semantics). ``no_first_chunk``: a
#: request_start and an LLM call (``llm_unmeasured``) whose first chunk the telemetry does not tell, no
#: first_token: answered, but its TTFT is unknown (never SLO-bad, see streams/core/stages.py).
STATUS_ORDER: tuple[RequestStatus, ...] = ("orphan", "no_first_chunk", "timed_out", "missing_stage", "complete")
#: Rank used in the record version: a more complete status wins a tie on event count. Stored rows keep the
#: ranks they were written with (``missing_stage`` 2, ``complete`` 3 before ``no_first_chunk`` came): only
#: rows of one request with equal event counts compare their ranks, so a re-insert of the same record
#: simply wins with its identical content.
STATUS_RANK: dict[str, int] = {"orphan": 0, "timed_out": 1, "no_first_chunk": 2, "missing_stage": 3, "complete": 4}

STAGE_COLUMNS: tuple[str, ...] = (
    "retrieval_ms",
    "vector_recall_ms",
    "bm25_recall_ms",
    "rerank_ms",
    "prompt_assemble_ms",
    "llm_ttft_ms",
)
ATTR_COLUMNS: tuple[str, ...] = (
    "prompt_tokens",
    "cached_tokens",
    "prompt_cache_hit",
    "draft_accept_rate",
    "rerank_top_k",
    "retrieval_cache_hit",
    "trace_id",
)


class RequestRecord(BaseModel):
    """A request joined from its stage events (docs/design.md, join semantics)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    tenant_id: str
    version_id: str = "unknown"
    rollout: Literal["stable", "canary"] | None = None
    route: str | None = None
    fallback_level: int = 0
    status: RequestStatus
    missing_stages: list[str] = Field(default_factory=list)
    started_at: float = Field(description="request_start.ts_ms, else the earliest event's ts_ms.")
    first_token_at: float | None = None
    window_start: float = Field(description="floor(started_at / W) * W, epoch ms.")
    ttft_ms: float | None = None
    retrieval_ms: float | None = None
    vector_recall_ms: float | None = None
    bm25_recall_ms: float | None = None
    rerank_ms: float | None = None
    prompt_assemble_ms: float | None = None
    llm_ttft_ms: float | None = None
    other_ms: float | None = Field(None, description="ttft - (retrieval + prompt_assemble + llm_ttft), signed.")
    llm_unmeasured_ms: float | None = Field(
        None,
        description="LLM calls whose first chunk the telemetry does not tell (stage llm_unmeasured): their whole "
        "duration, summed; an upper bound of llm_ttft, never a stage value.",
    )
    custom_stages: dict[str, float] = Field(default_factory=dict)
    stage_repeats: dict[str, int] = Field(default_factory=dict, description="Retries: extra events per stage.")
    recall_mode: RecallMode | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_cache_hit: bool | None = None
    draft_accept_rate: float | None = None
    rerank_top_k: int | None = None
    retrieval_cache_hit: bool | None = None
    trace_id: str | None = None
    duplicate_events: int = 0
    late_events: int = 0
    event_count: int = Field(description="Distinct events folded into this record.")
    event_keys: list[int] = Field(
        default_factory=list,
        description="The events counted, one signed 64-bit identity each (stage and dedup key hashed), in order: "
        "a late amendment tells a retry (summed) from a replay. Empty on rows written before the field.",
    )
    record_version: int = Field(description="Higher wins in the store: more events, then a better status.")
    amend: bool = Field(False, description="True when this record only carries late events to merge.")


def record_version(event_count: int, status: str, late_events: int = 0) -> int:
    """The ReplacingMergeTree version: the most complete record wins, whatever the arrival order."""
    return (event_count << 8) | (STATUS_RANK[status] << 4) | min(late_events, 15)
