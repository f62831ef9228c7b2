"""The canary comparison of ``ttft report``: stage P95s of the canary arm beside the stable arm.

Which arm a version belongs to comes, in order of precedence, from the tenant's settings
(``tenants.<t>.canary_version`` / ``stable_version``), the ``canary_verdicts`` rows of the span (their
``canary_version`` and ``stable_versions``), and the ``rollout`` the requests of the span were served with
(the majority of ``canary`` vs ``stable`` records of a version). When no version is marked stable, every
version that is not a canary forms the stable arm. Arms merge their versions' bins; P95s come from the
merged sketch.

Like with like: the arms are compared only over the windows in which both had traffic. A canary usually
runs for part of the span; comparing it with a stable arm that also covers the windows before the canary
started (a slow "before" phase, say) would credit the canary with the difference between phases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streams.settings import TenantConfig
from streams.views.summary import StageStat, stage_stats


def version_arms(
    tenant: str,
    rollout_rows: Iterable[Mapping[str, Any]],
    verdict_rows: Iterable[Mapping[str, Any]],
    config: TenantConfig | None,
    versions: Iterable[str],
) -> dict[str, str]:
    """``version -> "canary" | "stable"`` for one tenant; empty when the tenant has no canary."""
    arms: dict[str, str] = {}
    for row in rollout_rows:
        if row["tenant_id"] == tenant and (row["canary"] or row["stable"]):
            arms[str(row["version_id"])] = "canary" if int(row["canary"]) > int(row["stable"]) else "stable"
    for row in verdict_rows:
        if row["tenant_id"] == tenant:
            arms[str(row["canary_version"])] = "canary"
            for stable in row.get("stable_versions") or ():
                arms.setdefault(str(stable), "stable")
    if config is not None:
        if config.stable_version:
            arms[config.stable_version] = "stable"
        if config.canary_version:
            arms[config.canary_version] = "canary"
    if "canary" not in arms.values():
        return {}
    if "stable" not in arms.values():
        arms |= {v: "stable" for v in versions if v not in arms}
    return dict(sorted(arms.items()))


@dataclass(frozen=True, slots=True)
class CanaryComparison:
    """Both arms of one tenant over the span, and the latest verdict per stage x canary version."""

    tenant: str
    arms: dict[str, str]
    stages: dict[str, dict[str, StageStat]] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    #: Per arm, the window starts (epoch ms) its numbers come from: the same for both arms by construction.
    arm_windows: dict[str, tuple[int, ...]] = field(default_factory=dict)
    window_ms: int = 60_000

    @property
    def windows(self) -> tuple[int, ...]:
        """The windows compared (both arms had traffic in each)."""
        return self.arm_windows.get("canary", ())

    def span_text(self) -> str:
        """``over 12 windows where both arms had traffic (09:14-09:26 UTC)``."""
        if not self.windows:
            return "no window where both arms had traffic"

        def hhmm(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000.0, tz=UTC).strftime("%H:%M")

        first, last = self.windows[0], self.windows[-1] + self.window_ms
        return f"over {len(self.windows)} windows where both arms had traffic ({hhmm(first)}-{hhmm(last)} UTC)"

    def versions(self, arm: str) -> list[str]:
        return [v for v, a in self.arms.items() if a == arm]

    def ratio(self, stage: str) -> float | None:
        """Canary P95 / stable P95 of a stage (``None`` when either is unknown)."""
        canary, stable = self.stages.get("canary", {}).get(stage), self.stages.get("stable", {}).get(stage)
        if canary is None or stable is None or not canary.p95 or not stable.p95:
            return None
        return canary.p95 / stable.p95

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "arms": self.arms,
            "stages": {arm: {s: st.to_json() for s, st in stats.items()} for arm, stats in self.stages.items()},
            "ratios": {s: self.ratio(s) for s in self.stages.get("canary", {})},
            "verdicts": self.verdicts,
            "windows": list(self.windows),
            "span": self.span_text(),
        }


def compare_arms(
    tenant: str,
    arms: Mapping[str, str],
    stage_rows: Sequence[Mapping[str, Any]],
    verdict_rows: Sequence[Mapping[str, Any]],
    window_ms: int = 60_000,
) -> CanaryComparison:
    """Merge a tenant's per-window, per-version ``stage_windows`` rows into arms over the windows both arms
    had traffic in; keep the newest verdict per key."""
    mine = [
        r
        for r in stage_rows
        if r["tenant_id"] == tenant and arms.get(str(r["version_id"])) in ("stable", "canary") and int(r["count"])
    ]
    seen: dict[str, set[int]] = {"stable": set(), "canary": set()}
    for r in mine:
        seen[arms[str(r["version_id"])]].add(int(r["window_start"]))
    overlap = tuple(sorted(seen["stable"] & seen["canary"]))
    chosen = set(overlap)
    stages = {
        arm: stage_stats(r for r in mine if arms[str(r["version_id"])] == arm and int(r["window_start"]) in chosen)
        for arm in ("stable", "canary")
    }
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in verdict_rows:
        if row["tenant_id"] == tenant:
            latest[(str(row["stage"]), str(row["canary_version"]))] = dict(row)  # rows come oldest first
    arm_windows = {arm: overlap for arm in ("stable", "canary")}
    return CanaryComparison(tenant, dict(arms), stages, [latest[k] for k in sorted(latest)], arm_windows, window_ms)
