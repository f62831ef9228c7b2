"""Injected faults for pipeline tests: duplicates, missing stages, orphans and malformed messages.

Exact semantics (each fault uses its own random stream, so the clean traffic does not change when a
rate changes):

- ``duplicate``: each valid event is, with this probability, sent a second time right after the
  first copy: identical key, bytes and ``event_id`` (the join must count it once).
- ``missing_stage``: each request, with this probability, never sends one required span stage chosen
  uniformly from ``retrieval``, ``prompt_assemble``, ``llm_ttft`` (every attempt of it; sub-stages of
  a dropped ``retrieval`` are still sent). Expected status ``missing_stage``.
- ``orphan``: each request, with this probability, never sends its ``request_start``. Expected status
  ``orphan`` (this wins over ``missing_stage``, as in the join).
- ``malformed``: after each valid message, with this probability, one malformed message is inserted
  (same timestamp, key ``malformed-<n>``): raw garbage bytes or truncated JSON (reason
  ``invalid_json``), or a JSON object breaking the schema (reason ``schema``). Malformed messages never
  touch a real request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

import orjson

DROPPABLE_STAGES: Final = ("retrieval", "prompt_assemble", "llm_ttft")
_ALIASES: Final = {
    "dup": "duplicate",
    "duplicates": "duplicate",
    "missing": "missing_stage",
    "orphans": "orphan",
    "bad": "malformed",
}


@dataclass(frozen=True, slots=True)
class ErrorRates:
    """Probabilities of each injected fault (see the module docstring for the exact semantics)."""

    duplicate: float = 0.0
    missing_stage: float = 0.0
    orphan: float = 0.0
    malformed: float = 0.0

    def __post_init__(self) -> None:
        for name in ("duplicate", "missing_stage", "orphan", "malformed"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"error rate {name} must be within [0, 1], got {value}")

    @property
    def any(self) -> bool:
        return bool(self.duplicate or self.missing_stage or self.orphan or self.malformed)

    @classmethod
    def parse(cls, text: str) -> ErrorRates:
        """Parse ``"dup=0.01,missing=0.02,orphan=0.01,malformed=0.005"`` (also the full field names)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, raw = part.partition("=")
            if not sep:
                raise ValueError(f"error rate {part!r} must look like name=fraction")
            key = _ALIASES.get(name.strip(), name.strip())
            if key not in cls.__dataclass_fields__:
                raise ValueError(f"unknown error kind {name!r}; known: dup, missing, orphan, malformed")
            values[key] = float(raw)
        return cls(**values)


def drop_for_request(rng: random.Random, rates: ErrorRates) -> tuple[bool, str | None]:
    """Decide one request's faults: (drop its request_start?, required stage to drop or None)."""
    orphan = rates.orphan > 0 and rng.random() < rates.orphan
    missing = None
    if rates.missing_stage > 0 and rng.random() < rates.missing_stage:
        missing = DROPPABLE_STAGES[rng.randrange(len(DROPPABLE_STAGES))]
    return orphan, missing


def apply_drops(events: list[dict[str, Any]], orphan: bool, missing: str | None) -> list[dict[str, Any]]:
    """The events of one request without the dropped ones."""
    if not orphan and missing is None:
        return events
    return [e for e in events if not (e["stage"] == missing or (orphan and e["stage"] == "request_start"))]


def malformed_message(rng: random.Random, number: int, template: dict[str, Any]) -> tuple[bytes, bytes, str]:
    """One malformed message derived from a valid event: ``(key, value, expected reason_code)``."""
    request_id = f"malformed-{number}"
    key = request_id.encode()
    kind = rng.randrange(5)
    if kind == 0:
        return key, b"\xff" + rng.randbytes(rng.randrange(4, 64)), "invalid_json"
    bad = {**template, "request_id": request_id, "event_id": f"{request_id}/1"}
    if kind == 1:
        raw = orjson.dumps(bad)
        return key, raw[: max(1, len(raw) // 2)], "invalid_json"
    if kind == 2:
        bad["ts_ms"] = str(bad["ts_ms"])
    elif kind == 3:
        bad["stage"], bad["duration_ms"] = "llm_ttft", -1.0
    else:
        del bad["tenant_id"]
    return key, orjson.dumps(bad), "schema"
