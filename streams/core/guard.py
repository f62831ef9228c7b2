"""The dead-letter-rate guard: the one deliberate stop of the pipeline, and the tenant quarantine before it.

When more than ``share`` of the last ``window`` messages were invalid, something upstream is broken (a bad
deploy, a wrong topic). Dead-lettering the whole topic would bury the real data under noise and let the
offsets move past it; halting before the commit keeps the input where it is until an operator decides
(docs/operations.md, "Resuming after TTFTIngestHalted").

But one tenant's bad deploy must not stop every tenant. When the share is passed and removing one tenant's
dead letters would bring it back under the share, that tenant is *quarantined* instead: its messages
leave the window (its invalid events keep going to ``dead_letters``, its valid ones keep being joined) and
the guard watches everyone else. The global halt trips only when dead letters without a tenant (bytes
that do not even parse), or several tenants at once, pass the share, or when more than
``max_quarantined`` tenants would be quarantined (then the fault is not one tenant's).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class DeadLetterGuard:
    """Sliding window over the last ``window`` messages; trips when the invalid share exceeds ``share``."""

    window: int
    share: float
    max_quarantined: int = 10
    # The window as a ring of ``_count`` slots (at most ``window``), one per message: whether it was dead and
    # its tenant. Once full, ``_next`` is the oldest slot, which the next message takes (no allocation per
    # message, as a deque of pairs would have).
    _deads: list[bool] = field(default_factory=list)
    _tenants: list[str | None] = field(default_factory=list)
    _count: int = 0
    _next: int = 0
    _dead: int = 0
    _dead_by_tenant: Counter[str] = field(default_factory=Counter)
    tripped: bool = False
    #: Quarantined tenants, in the order they were quarantined.
    quarantined: dict[str, None] = field(default_factory=dict)
    #: Tenants quarantined since the caller last cleared this list (to log and count them).
    newly_quarantined: list[str] = field(default_factory=list)

    def observe(self, dead: bool, tenant: str | None = None) -> bool:
        """Record one message (``tenant``: its tenant, None when unknown); True once the guard tripped."""
        if tenant is not None and tenant in self.quarantined:
            return self.tripped
        self._push(dead, tenant)
        if self._count >= self.window and self._dead > self.share * self.window:
            self._judge()
        return self.tripped

    def _push(self, dead: bool, tenant: str | None) -> None:
        if self.window < 1:
            return  # a window of nothing: no message is kept
        if dead:
            self._dead += 1
            if tenant is not None:
                self._dead_by_tenant[tenant] += 1
        if self._count < self.window:
            self._deads.append(dead)
            self._tenants.append(tenant)
            self._count += 1
            return
        at = self._next
        if self._deads[at]:  # the oldest message leaves the window
            self._dead -= 1
            old_tenant = self._tenants[at]
            if old_tenant is not None:
                self._dead_by_tenant[old_tenant] -= 1
        self._deads[at] = dead
        self._tenants[at] = tenant
        self._next = at + 1 if at + 1 < self.window else 0

    def _judge(self) -> None:
        """Quarantine the one tenant behind the excess, or trip the global halt."""
        worst, count = self._dead_by_tenant.most_common(1)[0] if self._dead_by_tenant else (None, 0)
        alone = worst is not None and self._dead - count <= self.share * self.window
        if not alone or worst is None or len(self.quarantined) >= self.max_quarantined:
            self.tripped = True
            return
        self.quarantined[worst] = None
        self.newly_quarantined.append(worst)
        oldest_first = [*range(self._next, self._count), *range(self._next)]
        kept = [i for i in oldest_first if self._tenants[i] != worst]
        self._deads = [self._deads[i] for i in kept]
        self._tenants = [self._tenants[i] for i in kept]
        self._count, self._next = len(kept), 0
        self._dead = sum(self._deads)
        del self._dead_by_tenant[worst]

    @property
    def dead_share(self) -> float:
        return self._dead / self._count if self._count else 0.0

    @property
    def dead_letters(self) -> int:
        return self._dead
