"""What an OTLP span must satisfy before the assembler keeps anything of it (pure).

Protobuf and OTLP/JSON allow values the rest of the pipeline cannot hold: span times anywhere in
``[0, 2**64)`` (a time near ``2**64`` plus the join's grace no longer fits the 64-bit integers of the trace
state's changelog value), NaN and Infinity doubles, and attributes of any size. A span is checked when it
arrives, before it moves a watermark or joins a trace, and one that fails is dead-lettered whole with its
trace and span ids (:func:`span_problem`); nothing of it is held, so it can neither break the changelog nor
crowd the other spans of its trace out of their byte budget:

- ``schema``: a start or end outside the contract's range of ``ts_ms`` (2000-01-01 to 2200-01-01), an end
  before the start, or a kept number (a context attribute, a ``ttft.*`` attribute) that is NaN or Infinity;
- ``timestamp_skew``: the span ends more than ``caps.skew_limit_ms`` after the worker's clock (as a stage
  event would be refused; past times are never refused), unless that clock is a test's relative clock;
- ``too_large``: a context attribute (name plus JSON value) over :data:`MAX_CONTEXT_VALUE_BYTES`, a
  ``ttft.*`` attribute over ``caps.max_attrs_bytes``, or more ``ttft.*`` attributes than
  ``caps.max_attrs_keys``: its events could never pass the contract's bounds.

What the assembler keeps of a span is then bounded: :func:`note_bytes` is a held note's exact share of the
trace's changelog value, and :data:`SPAN_LINK_BYTES` bounds what every other span adds (its parent link and
its handled id), so a trace never packs past ``otlp.max_trace_state_bytes``.
"""

from __future__ import annotations

import math
from typing import Final

import orjson

from schemas.dead_letter import DeadLetterReason
from schemas.events import MAX_TS_MS, MIN_TS_MS
from schemas.otlp import OtlpSpan
from streams.core.otlp_mapping import SpanNote
from streams.settings import CapsConfig

_NS_PER_MS: Final = 1_000_000
#: The contract's range of ``ts_ms``, in epoch ns: every span time the assembler keeps lies in it.
MIN_SPAN_NS: Final = MIN_TS_MS * _NS_PER_MS
MAX_SPAN_NS: Final = MAX_TS_MS * _NS_PER_MS
#: What one span adds to its trace's changelog value besides a held note: its parent link (two quoted
#: 16-hex ids), its id among the handled (or retriever) spans, and the separators.
SPAN_LINK_BYTES: Final = 80
#: What a caller's stream flag adds besides (``"<16 hex>":false,`` in ``TraceState.callers``), with room.
CALLER_FLAG_BYTES: Final = 28


def link_bytes(note: SpanNote) -> int:
    """What ``note`` adds to its trace's changelog value besides its held note: :data:`SPAN_LINK_BYTES`, and its
    stream flag when it is a caller's."""
    return SPAN_LINK_BYTES + (CALLER_FLAG_BYTES if note.caller_stream is not None else 0)


#: A context attribute (request id, tenant, version, rollout, route, model, fallback level) with its name,
#: as JSON: the contract's longest ids (128 characters) fit with room to spare.
MAX_CONTEXT_VALUE_BYTES: Final = 1_024
#: A bound on a trace's changelog value besides its notes and span links: ids, times, flags and the
#: context values (a fixed set of names, each with its rank, within :data:`MAX_CONTEXT_VALUE_BYTES`).
FIXED_TRACE_BYTES: Final = 512 + 12 * (MAX_CONTEXT_VALUE_BYTES + 96)

#: A reason code and its detail.
Problem = tuple[DeadLetterReason, str]


def span_problem(span: OtlpSpan, now_ms: float, caps: CapsConfig) -> Problem | None:
    """Why the assembler must not keep ``span``'s times (None when they are fine)."""
    start, end = span.start_ns, span.end_ns
    if not (MIN_SPAN_NS <= start <= MAX_SPAN_NS and MIN_SPAN_NS <= end <= MAX_SPAN_NS):
        return "schema", f"span times {start} .. {end} ns are outside the contract's range (years 2000 to 2200)"
    if end < start:
        return "schema", f"the span ends {start - end} ns before it starts"
    if now_ms >= MIN_TS_MS and end > (now_ms + caps.skew_limit_ms) * _NS_PER_MS:
        ahead_ms = end / _NS_PER_MS - now_ms
        return (
            "timestamp_skew",
            f"the span ends {ahead_ms:.0f} ms after the worker's clock (limit {caps.skew_limit_ms} ms)",
        )
    return None


def note_problem(note: SpanNote, caps: CapsConfig) -> Problem | None:
    """Why the assembler must not keep what ``note`` read of a span (None when it may): a kept value that
    is no finite number, or too large for any event."""
    if len(note.attrs) > caps.max_attrs_keys:
        return "too_large", f"{len(note.attrs)} ttft.* attributes (at most {caps.max_attrs_keys} per event)"
    for kept, max_bytes in ((note.context, MAX_CONTEXT_VALUE_BYTES), (note.attrs, caps.max_attrs_bytes)):
        # A character is at most 6 bytes of JSON (an escape) and of a name at most 4 (UTF-8): only a long value
        # or name is measured.
        short = (max_bytes - 32) // 6
        for name, value in kept.items():
            kind = type(value)
            if kind is float and not math.isfinite(value):  # type: ignore[arg-type]
                return "schema", f"attribute {name[:64]!r} = {value!r} is not a finite number"
            if (kind is str and len(value) > short) or len(name) > short:  # type: ignore[arg-type]
                size = len(name.encode()) + len(orjson.dumps(value))
                if size > max_bytes:
                    return "too_large", f"attribute {name[:64]!r} is {size} bytes with its name (at most {max_bytes})"
    return None


def note_bytes(note: SpanNote) -> int:
    """The bytes ``note`` adds to its trace's changelog value while held (with its separator)."""
    return len(orjson.dumps(note.pack())) + 1
