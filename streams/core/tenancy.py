"""Which budget a tenant's requests are held under in the join: its own, or the shared pool (pure).

With registration off (:attr:`TenantBudgets.registered` None) every tenant has its own budget, as before.
With it on, a registered tenant (configured, or promoted by :class:`SteadyTenants`) has its own clock,
open-request cap and eviction order; every other tenant's requests go to one budget, :data:`POOL`, with one
clock per partition and one cap. So the join holds at most ``registered + 1`` clocks per partition however
many tenant ids arrive, and nothing an unregistered tenant sends can evict a registered tenant's requests.

Every call here is O(1) per event: a set lookup, and for an unregistered tenant one dict lookup in the
window's candidates (no scan or sort over tenants).
"""

from __future__ import annotations

from typing import Final

from schemas.vocabulary import RESERVED_TENANT
from streams.settings import Settings

#: The budget key of every unregistered tenant: ``__other__`` is reserved, so no tenant can have it.
POOL: Final = RESERVED_TENANT


class SteadyTenants:
    """Counts, per unregistered tenant, the consecutive event-time windows it sent events in; a tenant
    that reaches ``windows`` is promoted (registered) until the process ends.

    Two generations of candidates (this window's and the previous one's) replace a per-tenant history: a
    tenant seen in window ``w`` continues its run if it was seen in ``w - 1``. At most ``max_candidates`` are
    tracked per window (a spray of one-off ids cannot grow it; later tenants wait for the next window), and
    at most ``max_promoted`` are ever promoted. Events more than one window behind the newest are ignored.
    """

    __slots__ = ("current", "max_candidates", "max_promoted", "previous", "promoted", "skipped", "window", "windows")

    def __init__(self, windows: int, max_candidates: int, max_promoted: int) -> None:
        self.windows = windows
        self.max_candidates = max_candidates
        self.max_promoted = max_promoted
        self.window = -1  # the newest window index seen
        self.current: dict[str, int] = {}  # tenant -> run length ending at ``window``
        self.previous: dict[str, int] = {}  # the same, ending at ``window - 1``
        self.promoted: set[str] = set()
        #: Sightings not counted because the window's candidates were full or the promotions used up.
        self.skipped = 0

    def observe(self, tenant: str, window: int) -> bool:
        """Count an event of an unregistered ``tenant`` in window index ``window``; True when it is promoted."""
        if window > self.window:
            self.previous = self.current if window == self.window + 1 else {}
            self.current = {}
            self.window = window
        elif window < self.window:
            return False
        if tenant in self.current:
            return False
        if len(self.current) >= self.max_candidates or len(self.promoted) >= self.max_promoted:
            self.skipped += 1
            return False
        run = self.previous.get(tenant, 0) + 1
        self.current[tenant] = run
        if run < self.windows:
            return False
        self.promoted.add(tenant)
        return True


class TenantBudgets:
    """The budget key of each tenant (:meth:`key`): the tenant itself, or :data:`POOL`."""

    __slots__ = ("max_open_pool", "registered", "steady", "window_ms")

    def __init__(
        self,
        registered: frozenset[str] | None = None,
        *,
        max_open_pool: int = 20_000,
        steady_windows: int = 0,
        window_ms: int = 60_000,
        max_candidates: int = 10_000,
        max_promoted: int = 100,
    ) -> None:
        #: None: registration off, every tenant is its own budget.
        self.registered = registered
        #: Open requests of the pool together (``tenancy.max_open_requests_pool``).
        self.max_open_pool = max_open_pool
        self.window_ms = window_ms
        self.steady = (
            SteadyTenants(steady_windows, max_candidates, max_promoted)
            if registered is not None and steady_windows > 0
            else None
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> TenantBudgets:
        """The ``tenancy`` section (and the configured ``tenants``) of ``settings``."""
        t = settings.tenancy
        return cls(
            settings.registered_tenants(),
            max_open_pool=t.max_open_requests_pool,
            steady_windows=t.steady_windows,
            window_ms=settings.windows.window_s * 1000,
            max_candidates=t.max_steady_candidates,
            max_promoted=t.max_promoted,
        )

    @property
    def pooled(self) -> bool:
        """True when unregistered tenants share :data:`POOL`."""
        return self.registered is not None

    def is_registered(self, tenant: str) -> bool:
        """Whether ``tenant`` has its own budget now (always, with registration off)."""
        registered = self.registered
        if registered is None or tenant in registered:
            return True
        steady = self.steady
        return steady is not None and tenant in steady.promoted

    def key(self, tenant: str, ts_ms: float) -> str:
        """The budget a new request of ``tenant`` (first event at ``ts_ms``) is held under; counts the
        event towards promotion."""
        registered = self.registered
        if registered is None or tenant in registered:
            return tenant
        steady = self.steady
        if steady is None:
            return POOL
        if tenant in steady.promoted or steady.observe(tenant, int(ts_ms // self.window_ms)):
            return tenant
        return POOL

    @property
    def promoted(self) -> int:
        """Tenants registered by steadiness so far."""
        return 0 if self.steady is None else len(self.steady.promoted)
