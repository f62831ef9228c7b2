"""The time span a read-side view covers: ``--since`` / ``--until`` as durations or absolute instants.

Relative times are anchored on the newest stored data by default, not on the wall clock: simulated,
replayed or event-time-compressed traffic lives at other times than "now", and on live data the newest
closed window ends at most one window plus the grace period before now, so both anchors agree there.
``anchor="now"`` uses the wall clock instead. Absolute times are ISO 8601 (naive means UTC) or epoch
milliseconds. A span selects the windows whose ``window_start`` lies in ``[start_ms, end_ms)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

Anchor = Literal["data", "now"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_MS: Final = {
    "ms": 1.0,
    "s": 1_000.0,
    "m": 60_000.0,
    "h": 3_600_000.0,
    "d": 86_400_000.0,
    "w": 604_800_000.0,
}


class SpanError(ValueError):
    """A ``--since`` / ``--until`` value that is neither a duration nor an instant, or an empty span."""


@dataclass(frozen=True, slots=True)
class Span:
    """Half-open window-start range ``[start_ms, end_ms)`` in epoch milliseconds, and how it was anchored."""

    start_ms: int
    end_ms: int
    anchor: str

    def iso(self) -> tuple[str, str]:
        """Start and end as ISO 8601 UTC strings."""
        return iso_ms(self.start_ms), iso_ms(self.end_ms)

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


def iso_ms(ms: float) -> str:
    """Epoch milliseconds as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return datetime.fromtimestamp(ms / 1000.0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_duration_ms(text: str) -> float | None:
    """``"1h"``, ``"90s"``, ``"1h30m"``, ``"500ms"`` -> milliseconds; ``None`` if not a duration."""
    compact = text.strip().replace(" ", "")
    if not compact or _PART.sub("", compact):
        return None
    total = sum(float(n) * _UNIT_MS[unit] for n, unit in _PART.findall(compact))
    return total if total > 0 else None


def parse_instant_ms(text: str) -> float | None:
    """ISO 8601 instant (naive means UTC, ``Z`` accepted) or epoch milliseconds; ``None`` otherwise."""
    stripped = text.strip()
    if re.fullmatch(r"\d{11,}(\.\d+)?", stripped):
        return float(stripped)
    try:
        moment = datetime.fromisoformat(stripped.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp() * 1000.0


def _point(text: str, reference_ms: float, name: str) -> float:
    duration = parse_duration_ms(text)
    if duration is not None:
        return reference_ms - duration
    instant = parse_instant_ms(text)
    if instant is None:
        raise SpanError(f"--{name} {text!r}: use a duration (1h, 30m, 1h30m) or an ISO 8601 time")
    return instant


def resolve_span(
    since: str,
    until: str | None,
    *,
    newest_end_ms: float | None,
    now_ms: float,
    anchor: Anchor = "data",
) -> Span:
    """The span of ``--since`` / ``--until``.

    ``newest_end_ms`` is the end of the newest stored window (``None`` for an empty store, which falls back
    to the wall clock). Relative values both count back from the anchor (``--since 2h --until 1h`` is the
    hour before the last one); ``until`` defaults to the anchor.
    """
    use_data = anchor == "data" and newest_end_ms is not None
    reference = float(newest_end_ms) if use_data and newest_end_ms is not None else now_ms
    end = reference if until is None else _point(until, reference, "until")
    start = _point(since, reference, "since")
    relative = parse_duration_ms(since) is not None or until is None or parse_duration_ms(until) is not None
    used = ("data" if use_data else "now") if relative else "absolute"
    if start >= end:
        raise SpanError(f"empty span: since {iso_ms(start)} is not before until {iso_ms(end)}")
    return Span(int(start), int(end), used)
