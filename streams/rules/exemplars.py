"""Example requests for an alert, from tail attribution (:mod:`streams.core.attribution`).

Each closed window's ``tail_attribution`` rows (window x tenant x version) name the window's slowest
requests of that series and, with at least 200 complete requests (status ``ok``), the stages' shares of
TTFT in its slowest 5 % and in typical requests. The engine keeps the latest such row per series for a
bounded number of windows, and an alert carries the slowest requests of its tenant (of its version, for
version alerts; of the stable arm, for stage regressions) from the latest window that had any:
``ttft request <id>`` or the drill-down's "Slowest requests" shows each one's stages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

#: Request ids an alert carries at most.
ALERT_EXEMPLARS: Final = 3


@dataclass(frozen=True, slots=True)
class Attribution:
    """The latest useful tail attribution of one tenant x version."""

    window_start: float
    ttft_p95: float
    tail_count: int
    band_count: int
    exemplars: tuple[str, ...]
    tail_share: Mapping[str, float]
    band_share: Mapping[str, float]
    #: the series' arm in that window (``canary`` rows are left out of a stage regression's examples)
    arm: str | None = None


class ExemplarMemory:
    """Latest ``ok`` tail attribution per (tenant, version), kept ``keep_windows`` windows."""

    def __init__(self, window_ms: float, keep_windows: int) -> None:
        self._window_ms = window_ms
        self._keep_windows = keep_windows
        self._latest: dict[tuple[str, str], Attribution] = {}

    def observe(
        self, window_start: float, rows: Iterable[Mapping[str, Any]], arms: Mapping[tuple[str, str], str]
    ) -> None:
        """Fold one window's ``tail_attribution`` rows (rows without exemplars change nothing); ``arms``:
        the window's (tenant, version) -> ``stable``/``canary``."""
        for row in rows:
            ids = tuple(str(i) for i in row.get("exemplar_request_ids") or ())
            if not ids:
                continue
            attributed = row.get("status") == "ok"  # shares only from windows with enough records
            series = (str(row["tenant_id"]), str(row["version_id"]))
            self._latest[series] = Attribution(
                window_start,
                float(row.get("ttft_p95") or 0.0),
                int(row.get("tail_count") or 0) if attributed else 0,
                int(row.get("band_count") or 0) if attributed else 0,
                ids,
                {str(k): float(v) for k, v in (row.get("tail_share") or {}).items()} if attributed else {},
                {str(k): float(v) for k, v in (row.get("band_share") or {}).items()} if attributed else {},
                arms.get(series),
            )

    def latest(self, tenant: str, version: str = "", *, stable_only: bool = False) -> list[Attribution]:
        """The tenant's attributions of its latest window that had one (only ``version``'s when given, no
        canary's with ``stable_only``), slowest series first."""
        rows = [
            (v, a)
            for (t, v), a in self._latest.items()
            if t == tenant and (v == version if version else not (stable_only and a.arm == "canary"))
        ]
        if not rows:
            return []
        newest = max(a.window_start for _, a in rows)
        return [a for _, a in sorted(rows, key=lambda r: (-r[1].ttft_p95, r[0])) if a.window_start == newest]

    def pick(self, tenant: str, version: str = "", *, stable_only: bool = False) -> list[str]:
        """Up to :data:`ALERT_EXEMPLARS` request ids: the slowest of the tenant's latest attributed window."""
        out: list[str] = []
        for attribution in self.latest(tenant, version, stable_only=stable_only):
            out += [i for i in attribution.exemplars if i not in out]
        return out[:ALERT_EXEMPLARS]

    def prune(self, now: float) -> None:
        """Forget attributions older than the kept span."""
        horizon = now - self._keep_windows * self._window_ms
        for key in [k for k, a in self._latest.items() if a.window_start <= horizon]:
            del self._latest[key]


def tail_shares(attributions: Iterable[Attribution]) -> tuple[dict[str, float], dict[str, float]]:
    """Stage shares of TTFT in the slowest 5 % and in typical requests, weighted by tail and band counts."""
    items = list(attributions)

    def weighted(field: str, weight: str) -> dict[str, float]:
        total = sum(getattr(a, weight) for a in items)
        if not total:
            return {}
        stages = {s for a in items for s in getattr(a, field)}
        return {s: sum(getattr(a, field).get(s, 0.0) * getattr(a, weight) for a in items) / total for s in stages}

    return weighted("tail_share", "tail_count"), weighted("band_share", "band_count")
