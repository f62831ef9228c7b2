"""The series caps: per tenant and overall, deterministic admission, overflow to a tenant's own ``__other__``.

Admission rule (the same answer on every worker and after every restart, because it depends only on the
set of series present in one window, the series already stored for that window and the settings, never on
arrival order or process state):

1. ``__other__`` itself is never admitted as a tenant of its own; it is where overflow goes.
2. **Per tenant** (``max_versions_per_tenant``): a tenant's versions are ranked (series already stored
   for the window, ``pinned``, first; then the BLAKE2b hash of ``tenant\\0version``) and its versions past
   the cap fold into the tenant's *own* series ``(tenant, __other__)``. One tenant with thousands of
   versions therefore costs one extra row, and no other tenant's slot.
3. **Overall** (``max_series``): slots are dealt out round-robin over the tenants (configured tenants
   first, then by the hash of the tenant), each tenant first keeping its pinned series, so a late record
   that brings a new series never displaces rows already written (ReplacingMergeTree would otherwise keep
   them next to the new ``__other__`` row and count them twice). A tenant dealt fewer slots than it
   needs keeps its best versions plus ``(tenant, __other__)``; a tenant dealt none folds into
   ``(__other__, __other__)``.
4. **Registered tenants** (configured, or promoted: the writer's ``SteadyLedger``; ``registered`` None:
   every tenant alike): the registered tenants are dealt their slots
   first, round-robin among themselves; the other tenants then share at most ``max_pool_series`` slots
   (pinned ones included), so no number of made-up tenant ids takes a registered tenant's slot, and the
   rules see a bounded number of series.
5. ``overflow_series`` counts the series folded anywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schemas.vocabulary import RESERVED_TENANT as OTHER_TENANT
from streams.settings import Settings

Series = tuple[str, str]
OTHER_SERIES: Series = (OTHER_TENANT, OTHER_TENANT)


def series_rank(series: Series, always_admit: frozenset[str]) -> tuple[int, bytes, str, str]:
    """Sort key of a series in admission order (lower is admitted first)."""
    tenant, version = series
    digest = hashlib.blake2b(f"{tenant}\0{version}".encode(), digest_size=8).digest()
    return (0 if tenant in always_admit else 1, digest, tenant, version)


@dataclass(frozen=True, slots=True)
class SeriesAssignment:
    """The outcome of admission for one window: where each present series' rows go."""

    mapping: Mapping[Series, Series]
    admitted: frozenset[Series]
    overflow: frozenset[Series] = field(default_factory=frozenset)

    @property
    def overflow_series(self) -> int:
        """How many distinct series were folded into an ``__other__`` (the cap-tripped counter)."""
        return len(self.overflow)

    def overflow_into(self, target: Series) -> int:
        """How many present series were folded into ``target``."""
        return sum(1 for s in self.overflow if self.mapping.get(s) == target)

    def resolve(self, tenant: str, version: str) -> Series:
        """The series a record of (tenant, version) is aggregated under."""
        return self.mapping.get((tenant, version), OTHER_SERIES)


def tenant_rank(tenant: str, always_admit: frozenset[str]) -> tuple[int, bytes, str]:
    """Sort key of a tenant when slots are dealt out (lower first)."""
    return (0 if tenant in always_admit else 1, hashlib.blake2b(tenant.encode(), digest_size=8).digest(), tenant)


@dataclass(frozen=True, slots=True)
class SeriesAdmission:
    """Caps the tenant x version series per window (see the module docstring for the rule)."""

    max_series: int
    always_admit: frozenset[str] = frozenset()
    max_versions_per_tenant: int | None = None
    #: Tenants dealt slots before all others (None: registration off, every tenant alike).
    registered: frozenset[str] | None = None
    #: With ``registered``: slots all other tenants share per window.
    max_pool_series: int = 50

    def __post_init__(self) -> None:
        if self.max_series <= 0:
            raise ValueError("max_series must be positive")
        if self.max_versions_per_tenant is not None and self.max_versions_per_tenant <= 0:
            raise ValueError("max_versions_per_tenant must be positive")

    @classmethod
    def from_settings(cls, settings: Settings) -> SeriesAdmission:
        """``windows.max_series`` and ``windows.max_versions_per_tenant``, configured tenants first, the
        configured registered tenants before a pool of ``tenancy.max_series_pool`` slots (the writer adds the
        promoted ones: :class:`streams.core.tenancy.SteadyLedger`)."""
        w = settings.windows
        registered = settings.registered_tenants()
        first = frozenset(settings.tenants) | registered
        return cls(w.max_series, first, w.max_versions_per_tenant, registered, settings.tenancy.max_series_pool)

    def assign(self, present: Iterable[Series], pinned: Iterable[Series] = ()) -> SeriesAssignment:
        """Admit series of one window; ``pinned`` are the series already stored for it."""
        present_set = set(present)
        pinned_set = set(pinned)
        ranked = self._ranked(present_set, pinned_set)
        slots = self._deal(ranked, pinned_set)
        mapping: dict[Series, Series] = {}
        if OTHER_SERIES in present_set:
            mapping[OTHER_SERIES] = OTHER_SERIES
        admitted: set[Series] = set()
        for tenant, series in ranked.items():
            keep, fold_into = _cut(tenant, series, slots[tenant])
            admitted |= keep
            for s in series:
                mapping[s] = s if s in keep else fold_into
        overflow = {s for s in present_set if mapping.get(s, OTHER_SERIES) != s}
        return SeriesAssignment(mapping, frozenset(admitted), frozenset(overflow))

    def _ranked(self, present: set[Series], pinned: set[Series]) -> dict[str, list[Series]]:
        """Each tenant's series in admission order: pinned ones first, then by hash."""
        by_tenant: dict[str, list[Series]] = {}
        for series in present:
            if series[0] != OTHER_TENANT:
                by_tenant.setdefault(series[0], []).append(series)
        return {
            t: sorted(ss, key=lambda s: (s not in pinned, series_rank(s, self.always_admit)))
            for t, ss in by_tenant.items()
        }

    def _need(self, series: list[Series]) -> int:
        """Slots a tenant can use: its series, or its capped versions plus its own ``__other__`` row."""
        cap = self.max_versions_per_tenant
        return len(series) if cap is None or len(series) <= cap else cap + 1

    def _deal(self, ranked: Mapping[str, list[Series]], pinned: set[Series]) -> dict[str, int]:
        """Slots per tenant: room for its pinned series first, then round-robin in tenant rank order."""
        need = {t: self._need(series) for t, series in ranked.items()}
        slots: dict[str, int] = {}
        for tenant, series in ranked.items():
            held = sum(1 for s in series if s in pinned)
            # A tenant that will be cut needs one more slot for its own __other__ row beside its pinned ones.
            slots[tenant] = min(held + (1 if 0 < held < need[tenant] else 0), need[tenant])
        budget = self.max_series - sum(slots.values())
        order = sorted(ranked, key=lambda t: tenant_rank(t, self.always_admit))
        registered = self.registered
        if registered is None:
            _round_robin(order, slots, need, budget)
            return slots
        pool = [t for t in order if t not in registered]
        budget = _round_robin([t for t in order if t in registered], slots, need, budget)
        pool_room = self.max_pool_series - sum(slots[t] for t in pool)
        _round_robin(pool, slots, need, min(budget, pool_room))
        return slots


def _round_robin(order: list[str], slots: dict[str, int], need: Mapping[str, int], budget: int) -> int:
    """Deal ``budget`` slots one per hungry tenant per round, in ``order``; returns the slots left."""
    while budget > 0:
        hungry = [t for t in order if slots[t] < need[t]]
        if not hungry:
            break
        for tenant in hungry[:budget]:
            slots[tenant] += 1
        budget -= min(budget, len(hungry))
    return max(budget, 0)


def _cut(tenant: str, series: list[Series], slots: int) -> tuple[set[Series], Series]:
    """(series kept, where the tenant's other series fold) for a tenant dealt ``slots`` slots."""
    own_other = (tenant, OTHER_TENANT)
    if slots <= 0:
        return set(), OTHER_SERIES
    if slots >= len(series):
        return set(series), own_other
    return {*series[: slots - 1], own_other}, own_other
