"""Scenario traffic as Kafka messages, in emission order, deterministic for a seed.

Requests arrive as a Poisson process at ``rate_rps`` over ``duration_s`` of event time starting at
``start_ms``; each picks a tenant (weighted, :func:`streams.sim.scenarios.tenant_weights`), its phase
(by start time), its arm of a gray release, and becomes stage events via
:func:`streams.sim.model.simulate_request`. An event is emitted when it happens: a span at its end
(``ts_ms + duration_ms``), an instant at ``ts_ms``. Requests still in flight at the end of the run
complete. The message key is the ``request_id`` in UTF-8, the value the event as compact JSON.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final

import orjson

from streams.sim.faults import ErrorRates, apply_drops, drop_for_request, malformed_message
from streams.sim.model import simulate_request
from streams.sim.scenarios import DEFAULT_TENANTS, ProfileBook, tenant_weights

Message = tuple[bytes, bytes, float]
REQUIRED_STAGES: Final = ("request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token")
_EVENT, _DUPLICATE, _MALFORMED = 0, 1, 2


def request_id_prefix(scenario: str, seed: int, start_ms: float) -> str:
    """8 hex digits naming one run, so two runs (other seed, scenario or start) never share ids."""
    digest = hashlib.blake2b(f"{scenario}|{seed}|{start_ms:.3f}".encode(), digest_size=4)
    return digest.hexdigest()


def _stream(
    scenario: str,
    rate_rps: float,
    duration_s: float,
    tenants: Sequence[str] | None,
    seed: int,
    start_ms: float,
    errors: ErrorRates | None,
) -> Iterator[tuple[bytes, bytes, float, dict[str, Any] | None, int]]:
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate_rps and duration_s must be positive")
    book = ProfileBook(scenario, tenants or DEFAULT_TENANTS)
    cum_weights = list(accumulate(tenant_weights(len(book.tenants))))
    last_tenant = len(book.tenants) - 1
    traffic = random.Random(seed)
    faults = random.Random(f"{seed}:faults")
    errors = errors if errors is not None and errors.any else None
    prefix = request_id_prefix(scenario, seed, start_ms)
    span_ms = duration_s * 1000.0
    end_ms = start_ms + span_ms
    mean_gap_ms = 1000.0 / rate_rps
    dumps = orjson.dumps
    pending: list[tuple[float, int, bytes, dict[str, Any]]] = []
    seq = 0
    malformed_count = 0
    t = start_ms
    number = 0
    while True:
        # Rounded first, so the request_start (at exactly t) never precedes what was already emitted.
        t = round(t + traffic.expovariate(1.0) * mean_gap_ms, 3)
        arrived = t < end_ms
        horizon = t if arrived else float("inf")
        while pending and pending[0][0] <= horizon:
            emit_ts, _, key, event = heapq.heappop(pending)
            value = dumps(event)
            yield key, value, emit_ts, event, _EVENT
            if errors is None:
                continue
            if errors.duplicate and faults.random() < errors.duplicate:
                yield key, value, emit_ts, event, _DUPLICATE
            if errors.malformed and faults.random() < errors.malformed:
                bad_key, bad_value, reason = malformed_message(faults, malformed_count, event)
                malformed_count += 1
                yield bad_key, bad_value, emit_ts, {"reason": reason}, _MALFORMED
        if not arrived:
            return
        tenant_index = min(bisect_right(cum_weights, traffic.random()), last_tenant)
        phase_index = book.phase_index((t - start_ms) / span_ms)
        profile = book.profile(phase_index, tenant_index, traffic.random())
        request_id = f"{prefix}-{number}"
        number += 1
        events = simulate_request(traffic, profile, t, request_id)
        if errors is not None:
            events = apply_drops(events, *drop_for_request(faults, errors))
        key = request_id.encode()
        for event in events:
            heapq.heappush(pending, (event["ts_ms"] + event.get("duration_ms", 0.0), seq, key, event))
            seq += 1


def generate(
    scenario: str,
    *,
    rate_rps: float,
    duration_s: float,
    tenants: Sequence[str] | None = None,
    seed: int = 0,
    start_ms: float,
    errors: ErrorRates | None = None,
) -> Iterator[Message]:
    """Messages ``(key, value, emit_ts_ms)`` of a scenario run, in emission order.

    Deterministic for ``(scenario, rate_rps, duration_s, tenants, seed, start_ms, errors)``. Without
    ``errors`` every value is one valid ``StageEvent`` JSON object with an ``event_id``.
    """
    for key, value, ts, _, _ in _stream(scenario, rate_rps, duration_s, tenants, seed, start_ms, errors):
        yield key, value, ts


@dataclass(slots=True)
class SimulationTruth:
    """What the pipeline must conclude from a run (see :func:`generate_with_truth`).

    ``requests`` maps request_id to: ``tenant_id``, ``version_id``, ``rollout``, ``route``,
    ``fallback_level``, ``status`` (``complete`` / ``missing_stage`` / ``orphan``), ``missing_stages``,
    ``stages`` (stage -> summed duration_ms over distinct event ids, present stages only),
    ``started_at``, ``first_token_at``, ``ttft_ms`` (None without both instants), ``other_ms`` (None
    unless complete) and ``duplicate_events``. ``malformed`` lists the 0-based indices of malformed
    messages in the message list, ``malformed_reasons`` their expected reason codes, ``duplicates``
    the indices of the duplicate copies.
    """

    requests: dict[str, dict[str, Any]] = field(default_factory=dict)
    malformed: list[int] = field(default_factory=list)
    malformed_reasons: dict[int, str] = field(default_factory=dict)
    duplicates: list[int] = field(default_factory=list)


def generate_with_truth(
    scenario: str,
    *,
    rate_rps: float,
    duration_s: float,
    tenants: Sequence[str] | None = None,
    seed: int = 0,
    start_ms: float,
    errors: ErrorRates | None = None,
) -> tuple[list[Message], SimulationTruth]:
    """The same messages as :func:`generate`, as a list, plus the ground truth per request."""
    messages: list[Message] = []
    truth = SimulationTruth()
    for index, (key, value, ts, event, kind) in enumerate(
        _stream(scenario, rate_rps, duration_s, tenants, seed, start_ms, errors)
    ):
        messages.append((key, value, ts))
        assert event is not None
        if kind == _MALFORMED:
            truth.malformed.append(index)
            truth.malformed_reasons[index] = event["reason"]
        elif kind == _DUPLICATE:
            truth.duplicates.append(index)
            truth.requests[event["request_id"]]["duplicate_events"] += 1
        else:
            _fold_truth(truth.requests, event)
    for record in truth.requests.values():
        _finish_truth(record)
    return messages, truth


def _fold_truth(requests: dict[str, dict[str, Any]], event: dict[str, Any]) -> None:
    record = requests.get(event["request_id"])
    if record is None:
        record = requests[event["request_id"]] = {
            "tenant_id": event["tenant_id"],
            "version_id": event.get("version_id", "unknown"),
            "rollout": event.get("rollout"),
            "route": event.get("route"),
            "fallback_level": 0,
            "stages": {},
            "started_at": None,
            "first_token_at": None,
            "duplicate_events": 0,
        }
    record["fallback_level"] = max(record["fallback_level"], event.get("fallback_level", 0))
    stage = event["stage"]
    if stage == "request_start":
        record["started_at"] = event["ts_ms"]
    elif stage == "first_token":
        record["first_token_at"] = event["ts_ms"]
    else:
        stages = record["stages"]
        stages[stage] = stages[stage] + event["duration_ms"] if stage in stages else event["duration_ms"]


def _finish_truth(record: dict[str, Any]) -> None:
    start, first = record["started_at"], record["first_token_at"]
    present = set(record["stages"])
    if start is not None:
        present.add("request_start")
    if first is not None:
        present.add("first_token")
    record["missing_stages"] = [s for s in REQUIRED_STAGES if s not in present]
    if start is None:
        record["status"] = "orphan"
    elif record["missing_stages"]:
        record["status"] = "missing_stage"
    else:
        record["status"] = "complete"
    record["ttft_ms"] = first - start if start is not None and first is not None else None
    if record["status"] == "complete":
        stages = record["stages"]
        parents = stages["retrieval"] + stages["prompt_assemble"] + stages["llm_ttft"]
        record["other_ms"] = record["ttft_ms"] - parents
    else:
        record["other_ms"] = None
