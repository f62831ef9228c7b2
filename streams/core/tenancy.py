"""Registered tenants and the shared pool (pure): which budget a tenant's requests are held under in the
join (:class:`TenantBudgets`), and which tenants the writer deals series slots first and the silence rule
watches (:class:`SteadyLedger`).

Registration is on with the default settings: the registered tenants are those configured
(``tenancy.registered`` and ``tenants``) plus those promoted by steadiness, a rule on event time only: a
tenant with requests in ``tenancy.steady_windows`` consecutive windows (:class:`SteadyTenants` in the join,
over the requests it sees; :class:`SteadyLedger` in the writer, over the windows it stores, so a restart
or a replay gives the same set). :class:`TenantBudgets` built with ``registered`` None (tests, benches) gives
every tenant its own budget, as before registration.

In the join, a registered tenant has its own clock,
open-request cap and eviction order; every other tenant's requests go to one budget, :data:`POOL`, with one
clock per partition and one cap. So the join holds at most ``registered + 1`` clocks per partition however
many tenant ids arrive, and nothing an unregistered tenant sends can evict a registered tenant's requests.

Every call here is O(1) per event: a set lookup, and for an unregistered tenant one dict lookup in the
window's candidates (no scan or sort over tenants).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from schemas.vocabulary import RESERVED_TENANT
from streams.settings import Settings

#: The budget key of every unregistered tenant: ``__other__`` is reserved, so no tenant can have it.
POOL: Final = RESERVED_TENANT


class SteadyTenants:
    """The join's promotion rule: per unregistered tenant, the consecutive event-time windows it started
    requests in (a request's first event); a tenant that reaches ``windows`` is promoted (registered), and
    stays so while a run of ``windows`` keeps ending within the last ``keep`` windows (the writer's rule,
    :class:`SteadyLedger`, over the windows it stores).

    Two generations of candidates (this window's and the previous one's) replace a per-tenant history: a
    tenant seen in window ``w`` continues its run if it was seen in ``w - 1``. At most ``max_candidates`` new
    tenants are tracked per window (a spray of one-off ids cannot grow it; later new tenants wait for the
    next window), while a tenant continuing its run is always counted (up to ``2 * max_candidates``), so a
    spray cannot break a steady tenant's run. At most ``max_promoted`` are promoted at once. Events more
    than one window behind the newest only ask whether the tenant is promoted.
    """

    __slots__ = (
        "changed",
        "current",
        "fresh",
        "keep",
        "max_candidates",
        "max_promoted",
        "previous",
        "promoted",
        "skipped",
        "window",
        "windows",
    )

    def __init__(self, windows: int, max_candidates: int, max_promoted: int, keep: int = 1_440) -> None:
        self.windows = windows
        self.max_candidates = max_candidates
        self.max_promoted = max_promoted
        #: Windows a promotion lasts after the last window that ended a run of ``windows``.
        self.keep = keep
        self.window = -1  # the newest window index seen
        self.current: dict[str, int] = {}  # tenant -> run length ending at ``window``
        self.previous: dict[str, int] = {}  # the same, ending at ``window - 1``
        #: Promoted tenant -> the last window that ended a run of ``windows`` of it.
        self.promoted: dict[str, int] = {}
        #: Sightings not counted because the window's candidates were full or the promotions used up.
        self.skipped = 0
        #: Tenants promoted since the join last took them (:meth:`take_fresh`): it moves their pool-era
        #: requests to their own clocks, once per promotion.
        self.fresh: list[str] = []
        #: The promoted set changed (a promotion, an expiry, a restore) since the join last wrote it to its
        #: changelog (:meth:`snapshot`).
        self.changed = False

    def observe(self, tenant: str, window: int) -> bool:
        """Count a new request of an unregistered ``tenant`` in window index ``window``; True when the tenant
        is promoted (now or before)."""
        if window > self.window:
            self._turn(window)
        elif window < self.window:
            return tenant in self.promoted
        current = self.current
        if tenant in current:
            return tenant in self.promoted
        run = self.previous.get(tenant, 0) + 1
        if len(current) >= (self.max_candidates if run == 1 else 2 * self.max_candidates):
            self.skipped += 1
            return tenant in self.promoted
        current[tenant] = run
        promoted = self.promoted
        if run < self.windows:
            return tenant in promoted
        if tenant in promoted:
            promoted[tenant] = window
            return True
        if len(promoted) < self.max_promoted:
            promoted[tenant] = window
            self.fresh.append(tenant)
            self.changed = True
            return True
        self.skipped += 1
        return False

    def take_fresh(self) -> list[str]:
        """The tenants promoted since the last call (each once)."""
        fresh, self.fresh = self.fresh, []
        return fresh

    def snapshot(self) -> dict[str, int]:
        """The promoted tenants, each with the last window that ended a run of it (what a restart restores)."""
        return dict(self.promoted)

    def restore(self, promoted: Mapping[str, int]) -> None:
        """Merge promotions written before a restart, or by a partition's previous owner (:meth:`snapshot`);
        a tenant new here is fresh (its pool-era requests move to its own clock), up to ``max_promoted``."""
        mine = self.promoted
        for tenant, last in sorted(promoted.items()):
            if tenant in mine:
                mine[tenant] = max(mine[tenant], last)
            elif len(mine) < self.max_promoted and self.window - last <= self.keep:
                mine[tenant] = last
                self.fresh.append(tenant)
                self.changed = True

    def _turn(self, window: int) -> None:
        """A newer window: the current candidates become the previous ones; promotions past ``keep`` end."""
        self.previous = self.current if window == self.window + 1 else {}
        self.current = {}
        self.window = window
        promoted = self.promoted
        expired = [t for t, last in promoted.items() if window - last > self.keep]
        for tenant in expired:
            del promoted[tenant]
        if expired:
            self.changed = True


class SteadyLedger:
    """The writer's registered tenants: the configured ones plus those promoted from its closed windows.

    The same rule as the join's :class:`SteadyTenants`, on event-time data the store keeps: a tenant with
    requests in ``windows`` consecutive windows is promoted, until ``keep`` windows pass without another
    such run ending. Windows are booked in order as they close (:meth:`observe`, with every tenant that has
    a request in the window), and at start-up from the store's windows (:meth:`load`), so a restart or a
    replay of the same records gives the same set. At most ``max_promoted`` at once; within one window, in
    tenant-name order. ``windows`` 0: only the configured tenants.

    Cost: one pass over a closed window's tenants (the window's records are read for it anyway); the
    runs of the last window's tenants only are kept.
    """

    __slots__ = ("configured", "keep", "last", "max_promoted", "promoted", "registered", "runs", "windows")

    def __init__(self, configured: frozenset[str], windows: int, keep: int = 1_440, max_promoted: int = 100) -> None:
        self.configured = configured
        self.windows = windows
        self.keep = keep
        self.max_promoted = max_promoted
        #: The newest window index booked (None: none yet).
        self.last: int | None = None
        self.runs: dict[str, int] = {}  # tenant -> run length ending at ``last``
        #: Promoted tenant -> the last window that ended a run of ``windows`` of it.
        self.promoted: dict[str, int] = {}
        #: The configured and the promoted tenants.
        self.registered: frozenset[str] = configured

    @classmethod
    def from_settings(cls, settings: Settings) -> SteadyLedger:
        t = settings.tenancy
        return cls(settings.registered_tenants(), t.steady_windows, t.keep_promoted_windows, t.max_promoted)

    def reset(self) -> None:
        self.last = None
        self.runs = {}
        self.promoted = {}
        self.registered = self.configured

    def observe(self, window: int, tenants: Iterable[str]) -> bool:
        """Book the closed window of index ``window`` with the tenants that have requests in it; an older or
        already booked window is ignored. True when the registered tenants changed."""
        last = self.last
        if last is not None and window <= last:
            return False
        previous = self.runs if last is not None and window == last + 1 else {}
        promoted = self.promoted
        expired = [t for t, at in promoted.items() if window - at > self.keep]
        for tenant in expired:
            del promoted[tenant]
        changed = bool(expired)
        runs: dict[str, int] = {}
        configured = self.configured
        steady = self.windows
        for tenant in sorted(set(tenants)):
            if tenant in configured or tenant == POOL:
                continue
            run = previous.get(tenant, 0) + 1
            runs[tenant] = run
            if 0 < steady <= run and (tenant in promoted or len(promoted) < self.max_promoted):
                changed = changed or tenant not in promoted
                promoted[tenant] = window
        self.runs = runs
        self.last = window
        if changed:
            self.registered = configured | frozenset(promoted)
        return changed

    def load(self, history: Mapping[int, Iterable[str]]) -> None:
        """Start again from the store: ``history`` maps window indexes to their tenants (see
        :meth:`history_span`; tenants that can no longer matter may be left out)."""
        self.reset()
        for window in sorted(history):
            self.observe(window, history[window])

    def history_span(self, newest: int) -> tuple[int, int]:
        """(first window index to read, the index from which every tenant counts) for :meth:`load` up to
        window ``newest``: a promotion still held at ``newest`` ended its run at most ``keep`` windows before,
        and runs still open need the last ``windows - 1`` windows; before that, only a tenant present in at
        least ``windows`` windows can matter."""
        return newest - self.keep - max(self.windows, 1) + 1, newest - max(self.windows - 1, 0) + 1


class TenantBudgets:
    """The budget key of each tenant (:meth:`key`): the tenant itself, or :data:`POOL`."""

    __slots__ = ("max_open_pool", "max_remembered_pool", "registered", "steady", "window_ms")

    def __init__(
        self,
        registered: frozenset[str] | None = None,
        *,
        max_open_pool: int = 20_000,
        max_remembered_pool: int = 200_000,
        steady_windows: int = 0,
        window_ms: int = 60_000,
        max_candidates: int = 10_000,
        max_promoted: int = 100,
        keep_windows: int = 1_440,
    ) -> None:
        #: None: registration off, every tenant is its own budget.
        self.registered = registered
        #: Open requests of the pool together (``tenancy.max_open_requests_pool``).
        self.max_open_pool = max_open_pool
        #: Emitted requests of the pool remembered together (``tenancy.max_remembered_requests_pool``).
        self.max_remembered_pool = max_remembered_pool
        self.window_ms = window_ms
        self.steady = (
            SteadyTenants(steady_windows, max_candidates, max_promoted, keep_windows)
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
            max_remembered_pool=t.max_remembered_requests_pool,
            steady_windows=t.steady_windows,
            window_ms=settings.windows.window_s * 1000,
            max_candidates=t.max_steady_candidates,
            max_promoted=t.max_promoted,
            keep_windows=t.keep_promoted_windows,
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
        return tenant if steady.observe(tenant, int(ts_ms // self.window_ms)) else POOL

    def restore_promoted(self, promoted: Mapping[str, int]) -> None:
        """Merge promotions a join wrote to its changelog (configured tenants and the pool left out)."""
        steady, registered = self.steady, self.registered
        if steady is None or registered is None:
            return
        steady.restore({t: w for t, w in promoted.items() if t not in registered and t != POOL})

    @property
    def promoted(self) -> int:
        """Tenants registered by steadiness so far."""
        return 0 if self.steady is None else len(self.steady.promoted)
