"""Per-window facts the rules need, read from a :class:`WindowSnapshot`'s rows.

Row shapes are those of :mod:`streams.core.windows` / :mod:`streams.core.health`. Strata rows name their
stratum either with a ``stratum`` string or with ``route`` / ``prompt_cache`` / ``prompt_bucket``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.rules.model import WindowSnapshot


def stratum_of(row: Mapping[str, Any]) -> str:
    """The stratum label of a ``stage_strata`` row, e.g. ``route=main|cache=hit|len=1k-4k``."""
    named = row.get("stratum")
    if named:
        return str(named)
    return (
        f"route={row.get('route', 'unknown')}|cache={row.get('prompt_cache', 'unknown')}"
        f"|len={row.get('prompt_bucket', 'unknown')}"
    )


@dataclass(slots=True)
class TenantWindow:
    """One tenant's health in the closing window, summed over its versions."""

    total: int = 0
    complete: int = 0
    missing_stage: int = 0
    no_first_chunk: int = 0
    timed_out: int = 0
    orphan: int = 0
    ttft_count: int = 0
    slo_bad: int = 0
    has_health: bool = False

    @property
    def requests(self) -> int:
        """Requests of the window: ``window_health.total``, else what the ``ttft`` rows show."""
        return self.total if self.has_health else max(self.ttft_count, self.slo_bad)

    @property
    def slo_requests(self) -> int:
        """The SLO's request total: :attr:`requests` less those whose TTFT is unknown (``no_first_chunk``:
        answered, so not bad, but not known good either)."""
        return self.requests - self.no_first_chunk if self.has_health else self.requests

    @property
    def completeness(self) -> float | None:
        """Share of ``complete`` records; ``None`` without health rows."""
        if not self.has_health or self.total == 0:
            return None
        return self.complete / self.total

    def describe(self, tenant: str, floor: float) -> str:
        """Annotation text of a degraded window; LLM calls without a first chunk are named with their fix."""
        text = (
            f"tenant {tenant}: {self.complete}/{self.total} requests complete "
            f"({self.completeness or 0.0:.0%}, floor {floor:.0%}); missing_stage {self.missing_stage}, "
            f"no_first_chunk {self.no_first_chunk}, timed_out {self.timed_out}, "
            f"orphan {self.orphan}. Regression and canary verdicts are suspended for such windows."
        )
        if self.no_first_chunk:
            text += (
                f" {self.no_first_chunk} requests were answered but their LLM spans tell no first chunk (TTFT "
                "unknown; the instrumentation scope is in ttft_otlp_no_first_chunk): set "
                "gen_ai.response.time_to_first_chunk on the LLM span, or use an instrumentation that records "
                "the first chunk (docs/otlp-mapping.md)."
            )
        return text

    def numbers(self) -> dict[str, float]:
        """Health numbers for an alert's annotations."""
        return {
            "completeness": self.completeness or 0.0,
            "total": float(self.total),
            "timed_out": float(self.timed_out),
            "orphan": float(self.orphan),
            "missing_stage": float(self.missing_stage),
            "no_first_chunk": float(self.no_first_chunk),
        }


@dataclass(slots=True)
class WindowFacts:
    """Tenant totals of one window."""

    tenants: dict[str, TenantWindow] = field(default_factory=dict)

    def tenant(self, tenant: str) -> TenantWindow:
        return self.tenants.setdefault(tenant, TenantWindow())


def window_facts(snapshot: WindowSnapshot) -> WindowFacts:
    """Sum the health and ``ttft`` rows per tenant (every version, both arms)."""
    facts = WindowFacts()
    for row in snapshot.window_health:
        t = facts.tenant(str(row["tenant_id"]))
        t.has_health = True
        t.total += int(row.get("total") or 0)
        t.complete += int(row.get("complete") or 0)
        t.missing_stage += int(row.get("missing_stage") or 0)
        t.no_first_chunk += int(row.get("no_first_chunk") or 0)
        t.timed_out += int(row.get("timed_out") or 0)
        t.orphan += int(row.get("orphan") or 0)
    for row in snapshot.stage_windows:
        t = facts.tenant(str(row["tenant_id"]))
        if row.get("stage") == "ttft":
            t.ttft_count += int(row.get("count") or 0)
            t.slo_bad += int(row.get("slo_bad_count") or 0)
        elif not t.has_health:
            t.ttft_count = max(t.ttft_count, int(row.get("count") or 0))
    return facts


def draft_count(row: Mapping[str, Any]) -> int:
    """Requests that reported a draft acceptance rate (``draft_accept_count``; older rows: ``count``)."""
    return int(row.get("draft_accept_count", row.get("count")) or 0)
