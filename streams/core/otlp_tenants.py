"""The OTLP assembler's clocks and trace counts per tenant (pure), so one tenant's spans never time out,
resolve early or evict another tenant's traces.

Clocks, like the join's (:mod:`streams.core.join`): per input partition, each tenant has its own span
watermark (the latest end of its spans there, never past the worker's clock plus
``join.max_watermark_lead_ms``), moved on by the idle tick. A tenant's traces resolve on its own watermark,
which follows the partition's leading tenant only when it trails it by more than ``join.max_tenant_lag_ms``.
Spans that name no tenant have a clock of their own (tenant ``""``), which never runs ahead of the worker's
clock: no such span can hurry the resolution of another trace's spans that name no tenant.

Counts: :class:`TraceCounts` keeps each tenant's traces in creation order and finds the tenant holding the
most in O(1) (count buckets), so a cap evicts the oldest trace of the tenant over its own cap, or of the
largest tenant past the global cap, at a cost that does not grow with the number of tenants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

_NS_PER_MS: Final = 1_000_000


@dataclass(slots=True)
class TenantClock:
    """One tenant's span watermark and deadline heap on one partition; heap entries are ``(due ns, trace
    key)``, an entry whose trace no longer has that deadline is stale and skipped (lazy deletion)."""

    watermark_ns: int = 0
    idle_base_ns: int = 0
    last_wall_ms: float | None = None
    deadlines: list[tuple[int, str]] = field(default_factory=list)


@dataclass(slots=True)
class PartitionClocks:
    """The tenants' clocks of one partition and the highest watermark among them (``lead_ns``)."""

    lead_ns: int = 0
    tenants: dict[str, TenantClock] = field(default_factory=dict)

    def clock(self, tenant: str) -> TenantClock:
        clock = self.tenants.get(tenant)
        if clock is None:
            clock = self.tenants[tenant] = TenantClock()
        return clock

    def raise_to(self, tenant: str, end_ns: int, now_ms: float, max_lead_ms: int) -> TenantClock:
        """Move ``tenant``'s watermark to a span's end, never past the worker's clock plus ``max_lead_ms`` (no
        lead for spans that name no tenant); the idle tick restarts from it."""
        clock = self.clock(tenant)
        bound_ns = round((now_ms + (max_lead_ms if tenant else 0)) * _NS_PER_MS)
        clock.watermark_ns = max(clock.watermark_ns, min(end_ns, bound_ns))
        clock.idle_base_ns, clock.last_wall_ms = clock.watermark_ns, now_ms
        self.lead_ns = max(self.lead_ns, clock.watermark_ns)
        return clock

    def tick(self, now_ms: float, idle_tick_ms: int) -> None:
        """The idle tick: a tenant that sent nothing for ``idle_tick_ms`` of wall time moves on by the wall
        time since its last span (a restored clock starts its idle time now)."""
        for tenant, clock in self.tenants.items():
            if clock.last_wall_ms is None:
                clock.last_wall_ms, clock.idle_base_ns = now_ms, clock.watermark_ns
            elif now_ms - clock.last_wall_ms >= idle_tick_ms:
                ticked = clock.idle_base_ns + round((now_ms - clock.last_wall_ms) * _NS_PER_MS)
                if not tenant:  # spans without a tenant: never past the worker's clock
                    ticked = min(ticked, round(now_ms * _NS_PER_MS))
                clock.watermark_ns = max(clock.watermark_ns, ticked)
                self.lead_ns = max(self.lead_ns, clock.watermark_ns)

    def hold_idle(self) -> None:
        """Not known to be caught up: every tenant's idle time starts again once the partition is, so time the
        bridge could not read it (a backlog, the broker down) never counts as silence."""
        for clock in self.tenants.values():
            clock.last_wall_ms = None

    def effective_ns(self, clock: TenantClock, max_tenant_lag_ms: int) -> int:
        """The watermark a tenant's traces resolve by: its own, or the lead's minus the allowed lag."""
        return max(clock.watermark_ns, self.lead_ns - max_tenant_lag_ms * _NS_PER_MS)


class TraceCounts:
    """Each tenant's trace keys in creation order, and the tenant holding the most (ties: the one that
    reached that count last), both in O(1) per change."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, dict[str, None]] = {}
        self._buckets: dict[int, dict[str, None]] = {}
        self._top = 0
        self.total = 0

    def count(self, tenant: str) -> int:
        keys = self._by_tenant.get(tenant)
        return 0 if keys is None else len(keys)

    def add(self, tenant: str, key: str) -> None:
        keys = self._by_tenant.setdefault(tenant, {})
        if key in keys:
            return
        self._move(tenant, len(keys), len(keys) + 1)
        keys[key] = None
        self.total += 1

    def remove(self, tenant: str, key: str) -> None:
        keys = self._by_tenant.get(tenant)
        if keys is None or key not in keys:
            return
        self._move(tenant, len(keys), len(keys) - 1)
        del keys[key]
        self.total -= 1
        if not keys:
            del self._by_tenant[tenant]

    def oldest(self, tenant: str) -> str:
        """The key of ``tenant``'s oldest trace (it has one)."""
        return next(iter(self._by_tenant[tenant]))

    def largest(self) -> str:
        """The tenant holding the most traces (there is one)."""
        while self._top > 0 and not self._buckets.get(self._top):
            self._top -= 1
        return next(reversed(self._buckets[self._top]))

    def _move(self, tenant: str, old: int, new: int) -> None:
        if old:
            bucket = self._buckets[old]
            del bucket[tenant]
            if not bucket:
                del self._buckets[old]
        if new:
            self._buckets.setdefault(new, {})[tenant] = None
            self._top = max(self._top, new)
