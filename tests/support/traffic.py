"""Test traffic with ground truth computed independently of the pipeline code.

Each request gets the five required stages plus optional recall sub-stages; events are shuffled within the
request, some are duplicated, some requests lose a required stage or their request_start, and some
messages are malformed. The truth is what docs/design.md's join semantics say the record must be.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

TENANTS = ("acme", "globex", "bücher-ü", 'q"uote')
REQUIRED = ("request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token")


@dataclass
class Traffic:
    """Messages to produce (key, value) in order, and the expected record per request id."""

    messages: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    truth: dict[str, dict[str, Any]] = field(default_factory=dict)
    malformed: int = 0
    duplicates: int = 0


def build_traffic(
    n_requests: int,
    *,
    seed: int = 7,
    start_ms: float,
    spacing_ms: float = 1.0,
    dup_share: float = 0.05,
    missing_share: float = 0.02,
    orphan_share: float = 0.01,
    malformed_share: float = 0.01,
    prefix: str = "req",
) -> Traffic:
    rng = random.Random(seed)
    out = Traffic()
    for i in range(n_requests):
        rid = f"{prefix}-{i:06d}"
        tenant = TENANTS[i % len(TENANTS)]
        t0 = start_ms + i * spacing_ms
        retrieval = round(rng.uniform(50, 600), 3)
        vector = round(retrieval * 0.5, 3)
        bm25 = round(retrieval * 0.4, 3)
        assemble = round(rng.uniform(10, 200), 3)
        llm = round(rng.uniform(300, 2000), 3)
        gap = round(rng.uniform(0, 20), 3)
        t_ret = t0 + 1
        t_asm = t_ret + retrieval
        t_llm = t_asm + assemble
        t_ft = t_llm + llm + gap
        common = {"tenant_id": tenant, "request_id": rid, "version_id": "v1", "route": "main"}
        events: list[dict[str, Any]] = [
            {**common, "stage": "request_start", "ts_ms": t0},
            {**common, "stage": "retrieval", "ts_ms": t_ret, "duration_ms": retrieval},
            {**common, "stage": "vector_recall", "ts_ms": t_ret, "duration_ms": vector},
            {**common, "stage": "bm25_recall", "ts_ms": t_ret, "duration_ms": bm25},
            {
                **common,
                "stage": "prompt_assemble",
                "ts_ms": t_asm,
                "duration_ms": assemble,
                "attrs": {"prompt_tokens": 1500, "prompt_cache_hit": i % 2 == 0},
            },
            {
                **common,
                "stage": "llm_ttft",
                "ts_ms": t_llm,
                "duration_ms": llm,
                "attrs": {"draft_accept_rate": 0.8},
            },
            {**common, "stage": "first_token", "ts_ms": t_ft},
        ]
        for j, ev in enumerate(events):
            ev["event_id"] = f"{rid}-{j}"
        roll = rng.random()
        status = "complete"
        missing: list[str] = []
        if roll < orphan_share:
            events = [e for e in events if e["stage"] != "request_start"]
            status = "orphan"
            missing = ["request_start"]
        elif roll < orphan_share + missing_share:
            drop = rng.choice(("retrieval", "prompt_assemble", "llm_ttft"))
            events = [e for e in events if e["stage"] != drop]
            status = "missing_stage"
            missing = [drop]
        present = {e["stage"]: e for e in events}
        ttft = round(t_ft - t0, 6) if status != "orphan" else None
        truth: dict[str, Any] = {
            "tenant_id": tenant,
            "status": status,
            "missing_stages": missing,
            "retrieval_ms": present["retrieval"]["duration_ms"] if "retrieval" in present else None,
            "prompt_assemble_ms": present["prompt_assemble"]["duration_ms"] if "prompt_assemble" in present else None,
            "llm_ttft_ms": present["llm_ttft"]["duration_ms"] if "llm_ttft" in present else None,
            "vector_recall_ms": vector,
            "bm25_recall_ms": bm25,
            "ttft_ms": ttft,
            "recall_mode": "parallel",
        }
        out.truth[rid] = truth
        rng.shuffle(events)
        for ev in events:
            raw = orjson.dumps(ev)
            out.messages.append((rid.encode(), raw))
            if rng.random() < dup_share:
                out.messages.append((rid.encode(), raw))
                out.duplicates += 1
        if rng.random() < malformed_share:
            out.messages.append((rid.encode(), _malformed(rng, rid)))
            out.malformed += 1
    return out


def wrong_values(got: dict[str, dict[str, Any]], truth: dict[str, dict[str, Any]]) -> list[str]:
    """``"rid.field: want … got …"`` for every ground-truth field a stored or emitted record (by request id)
    gets wrong; floats compare to 1e-9 relative / 1e-6 absolute."""
    wrong: list[str] = []
    for rid, want in truth.items():
        record = got[rid]
        for key, value in want.items():
            have = record.get(key)
            if isinstance(value, float) and have is not None:
                ok = math.isclose(have, value, rel_tol=1e-9, abs_tol=1e-6)
            else:
                ok = have == value
            if not ok:
                wrong.append(f"{rid}.{key}: want {value!r} got {have!r}")
    return wrong


def _malformed(rng: random.Random, rid: str) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return b"{not json"
    if kind == 1:
        return orjson.dumps({"request_id": rid, "tenant_id": "acme", "stage": "retrieval", "ts_ms": "soon"})
    if kind == 2:
        return orjson.dumps(
            {"request_id": rid, "tenant_id": "acme", "stage": "retrieval", "ts_ms": 1.7e12, "duration_ms": -5}
        )
    return b"\xff\xfe garbage"
