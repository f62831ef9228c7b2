"""The tenant x version series cap: deterministic admission, overflow to ``__other__``.

Admission rule (the same answer on every worker and after every restart, because it depends only on the
set of series present in one window, the series already stored for that window and the settings, never on
arrival order or process state):

1. ``__other__`` itself is never admitted as a series of its own; it is where overflow goes.
2. Series already stored for the window (``pinned``) keep their slots first, so a late record that
   brings a new series never displaces rows that were already written (ReplacingMergeTree would otherwise
   keep the displaced rows next to the new ``__other__`` row and count them twice).
3. The remaining series are ranked by (tenant configured in ``settings.tenants`` first, then the BLAKE2b
   hash of ``tenant\\0version``) and admitted in that order until ``max_series`` series are admitted. A
   hash rank, unlike "first seen", needs no shared state, and with a stable population it admits the same
   series in every window.
4. Every other series maps to ``(__other__, __other__)``; ``overflow_series`` counts them.
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
        """How many distinct series were folded into ``__other__`` (the cap-tripped counter)."""
        return len(self.overflow)

    def resolve(self, tenant: str, version: str) -> Series:
        """The series a record of (tenant, version) is aggregated under."""
        return self.mapping.get((tenant, version), OTHER_SERIES)


@dataclass(frozen=True, slots=True)
class SeriesAdmission:
    """Caps the number of tenant x version series per window (see the module docstring for the rule)."""

    max_series: int
    always_admit: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.max_series <= 0:
            raise ValueError("max_series must be positive")

    @classmethod
    def from_settings(cls, settings: Settings) -> SeriesAdmission:
        """``windows.max_series``, with the tenants named in ``settings.tenants`` ranked first."""
        return cls(settings.windows.max_series, frozenset(settings.tenants))

    def assign(self, present: Iterable[Series], pinned: Iterable[Series] = ()) -> SeriesAssignment:
        """Admit series of one window; ``pinned`` are the series already stored for it."""
        present_set = set(present)
        mapping: dict[Series, Series] = {}
        if OTHER_SERIES in present_set:
            mapping[OTHER_SERIES] = OTHER_SERIES
        candidates = {s for s in present_set if s[0] != OTHER_TENANT}
        pinned_set = {s for s in pinned if s[0] != OTHER_TENANT}
        ordered = sorted(pinned_set & candidates, key=lambda s: series_rank(s, self.always_admit))
        ordered += sorted(candidates - pinned_set, key=lambda s: series_rank(s, self.always_admit))
        admitted = ordered[: self.max_series]
        overflow = ordered[self.max_series :]
        for series in admitted:
            mapping[series] = series
        for series in overflow:
            mapping[series] = OTHER_SERIES
        return SeriesAssignment(mapping, frozenset(admitted), frozenset(overflow))
