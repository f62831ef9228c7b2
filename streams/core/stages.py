"""Which values of a request record feed which latency sketch, and the strata of the canary view.

docs/design.md, windows: latency sketches take ``complete``, ``missing_stage`` and ``no_first_chunk`` records
only, present stages only, ``ttft`` when both instants exist. ``other`` is the signed unattributed gap,
clamped at 0 in the sketch and counted as negative. ``timed_out`` and ``orphan`` records feed completeness
and SLO burn only.

A ``no_first_chunk`` request was answered, but its telemetry does not tell its first chunk: its retrieval,
rerank and prompt assembly are real measurements and feed their sketches; it has no ``llm_ttft`` nor
``ttft`` (no first token), so it is never SLO-bad, and the SLO's request total leaves it out
(:attr:`streams.rules.snapshot.TenantWindow.slo_requests`): counting it as good would dilute a real burn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from schemas.records import STAGE_COLUMNS
from streams.settings import KNOWN_STAGES, PARENT_STAGES, SUB_STAGES

Record = Mapping[str, Any]

TTFT: Final = "ttft"
OTHER: Final = "other"
SKETCHED_STATUSES: Final = frozenset({"complete", "missing_stage", "no_first_chunk"})
#: Records of these statuses count as SLO-bad whatever their latency: an outage never improves the P95.
ALWAYS_SLO_BAD: Final = frozenset({"timed_out", "orphan"})
#: Custom stages may not reuse these names: their rows would merge with the built-in ones.
RESERVED_STAGE_NAMES: Final = frozenset({TTFT, OTHER, *KNOWN_STAGES})
UNKNOWN: Final = "unknown"
PROMPT_BUCKETS: Final = ("<1k", "1k-4k", "4k-16k", ">=16k", UNKNOWN)


def stage_order(stages: Sequence[str] | set[str]) -> list[str]:
    """Row order: parents, sub-stages, ``other``, custom stages (sorted), ``ttft``."""
    fixed = [*PARENT_STAGES, *SUB_STAGES, OTHER]
    custom = sorted(s for s in stages if s not in fixed and s != TTFT)
    ordered = [s for s in fixed if s in stages] + custom
    if TTFT in stages:
        ordered.append(TTFT)
    return ordered


def is_sketched(record: Record) -> bool:
    """Whether a record's latencies feed the sketches."""
    return record.get("status") in SKETCHED_STATUSES


def stage_samples(records: Sequence[Record]) -> dict[str, list[tuple[int, float]]]:
    """Per stage, ``(index in records, signed ms)`` of every present value, in :func:`stage_order`.

    ``records`` are sketched records (:func:`is_sketched`). Column by column rather than record by
    record: list comprehensions keep a 100,000-request window well under a second.
    """
    samples: dict[str, list[tuple[int, float]]] = {}
    for column in STAGE_COLUMNS:
        samples[column[:-3]] = [(i, float(v)) for i, r in enumerate(records) if (v := r.get(column)) is not None]
    samples[OTHER] = [(i, float(v)) for i, r in enumerate(records) if (v := r.get("other_ms")) is not None]
    customs = [(i, c) for i, r in enumerate(records) if (c := r.get("custom_stages"))]
    for name in sorted({n for _, c in customs for n in c} - RESERVED_STAGE_NAMES):
        samples[name] = [(i, float(c[name])) for i, c in customs if name in c]
    samples[TTFT] = [
        (i, float(v))
        for i, r in enumerate(records)
        if (v := r.get("ttft_ms")) is not None and r.get("first_token_at") is not None
    ]
    return {stage: samples[stage] for stage in stage_order(set(samples)) if samples[stage]}


def is_slo_bad(record: Record, slo_ms: float) -> bool:
    """SLO-bad: TTFT above the tenant's SLO, or never answered (timed out) or unattributable (orphan); never
    a record whose TTFT is unknown (``no_first_chunk``: it has no ttft)."""
    if record.get("status") in ALWAYS_SLO_BAD:
        return True
    ttft = record.get("ttft_ms")
    return is_sketched(record) and ttft is not None and float(ttft) > slo_ms


def cache_state(record: Record) -> str:
    """Prompt-cache stratum: ``hit`` / ``miss`` / ``unknown``."""
    hit = record.get("prompt_cache_hit")
    if hit is None:
        return UNKNOWN
    return "hit" if hit else "miss"


def prompt_bucket(record: Record) -> str:
    """Prompt-length stratum from ``prompt_tokens``."""
    tokens = record.get("prompt_tokens")
    if tokens is None:
        return UNKNOWN
    if tokens < 1_024:
        return "<1k"
    if tokens < 4_096:
        return "1k-4k"
    if tokens < 16_384:
        return "4k-16k"
    return ">=16k"


def route_of(record: Record) -> str:
    """Route stratum; ``unknown`` when the request named none."""
    route = record.get("route")
    return str(route) if route else UNKNOWN
