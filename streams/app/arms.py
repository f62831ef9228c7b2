"""Which arm of a gray release each (tenant, version) served in a window."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from streams.settings import Settings


def arms_from_records(records: list[dict[str, Any]], settings: Settings) -> dict[tuple[str, str], str]:
    """Which arm each (tenant, version) served: configured versions first, else the records' rollout."""
    votes: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        rollout = r.get("rollout")
        if rollout in ("stable", "canary"):
            votes[(r["tenant_id"], r.get("version_id") or "unknown")][rollout] += 1
    arms = {k: max(v, key=lambda arm: (v[arm], arm)) for k, v in votes.items()}
    for tenant, cfg in settings.tenants.items():
        for t, version in {k for k in arms if k[0] == tenant} | {
            (tenant, v) for v in (cfg.stable_version, cfg.canary_version) if v
        }:
            if version == cfg.stable_version:
                arms[(t, version)] = "stable"
            elif version == cfg.canary_version:
                arms[(t, version)] = "canary"
    return arms
