"""TTFTDraftAcceptanceLow: speculative decoding whose draft tokens are mostly rejected.

Below ~60 % acceptance the draft model costs more first-token time than it saves, so the advice is to
fall back to the main model directly. Judged per tenant x version on the window's ``llm_signals`` row
(acceptance P50 over the requests that reported a rate); ``recovery_threshold`` gives hysteresis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.rules.lifecycle import Signal
from streams.rules.model import Outcome
from streams.rules.snapshot import draft_count
from streams.rules_config import DraftAcceptanceRule


@dataclass(frozen=True, slots=True)
class DraftCheck:
    """One evaluation of one tenant x version."""

    outcome: Outcome
    signal: Signal
    description: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


def check_draft(row: Mapping[str, Any], rule: DraftAcceptanceRule) -> DraftCheck:
    """Judge one ``llm_signals`` row."""
    tenant, version = row["tenant_id"], row["version_id"]
    p50, n = row.get("draft_accept_p50"), draft_count(row)
    if p50 is None:
        return DraftCheck("inconclusive", "hold")
    if n < rule.min_samples:
        return DraftCheck("insufficient_traffic", "hold")
    p50 = float(p50)
    p10 = row.get("draft_accept_p10")
    numbers = {"draft_accept_p50": p50, "requests": float(n)}
    if p10 is not None:
        numbers["draft_accept_p10"] = float(p10)
    p10_text = f", P10 {float(p10):.0%}" if p10 is not None else ""
    measured = f"draft acceptance P50 {p50:.0%}{p10_text} over {n} requests"
    if p50 < rule.threshold:
        return DraftCheck(
            "breach",
            "breach",
            f"speculative decoding on version {version} of tenant {tenant}: {measured}, below "
            f"{rule.threshold:.0%}. Below ~60 % the draft model costs more first-token time than it saves: "
            "fall back to the main model directly (disable drafting) for this version.",
            numbers,
        )
    signal: Signal = "clear" if p50 >= rule.recovery_threshold else "hold"
    return DraftCheck(
        "ok",
        signal,
        f"version {version} of tenant {tenant}: {measured} (recovery at {rule.recovery_threshold:.0%})",
        numbers,
    )
