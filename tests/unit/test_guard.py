from collections import Counter, deque

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.guard import DeadLetterGuard


def test_guard_needs_a_full_window_before_it_trips() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    assert not any(guard.observe(True) for _ in range(5))
    assert guard.dead_share == 1.0


def test_guard_trips_above_the_share_and_stays_tripped() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    for i in range(10):
        guard.observe(i % 2 == 0)  # exactly 50 %: not above
    assert not guard.tripped
    assert not guard.observe(True)  # slides out a dead one: still 5 of 10
    assert guard.observe(True)  # 6 of the last 10
    for _ in range(20):
        guard.observe(False)
    assert guard.tripped


def test_guard_window_slides() -> None:
    guard = DeadLetterGuard(window=4, share=0.5)
    for dead in (True, True, False, False, False, False, True, True):
        assert not guard.observe(dead)
    assert guard.dead_letters == 2


# --- issue 14: quarantine one tenant instead of halting everyone ----------------------------------


def test_one_tenants_bad_deploy_quarantines_it_and_never_halts() -> None:
    guard = DeadLetterGuard(window=100, share=0.5)
    for i in range(1_000):
        tenant = ("bad", "good-a", "good-b", "good-c")[i % 4] if i < 200 else ("bad" if i % 4 else "good-a")
        assert not guard.observe(tenant == "bad", tenant)  # bad: 75 % of the traffic, all invalid
    assert list(guard.quarantined) == ["bad"] and guard.newly_quarantined == ["bad"]
    assert not guard.tripped and guard.dead_letters == 0


def test_dead_letters_without_a_tenant_still_halt() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    tripped = [guard.observe(i % 10 < 6, None) for i in range(10)]
    assert tripped[-1] and not guard.quarantined


def test_several_tenants_at_once_still_halt() -> None:
    guard = DeadLetterGuard(window=12, share=0.5)
    results = [guard.observe(True, ("a", "b", "c")[i % 3]) for i in range(12)]
    assert results[-1] and not guard.quarantined  # no single tenant explains the excess


def test_a_quarantined_tenant_no_longer_counts_and_the_rest_is_still_watched() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    for _ in range(10):
        guard.observe(True, "bad")
    assert list(guard.quarantined) == ["bad"] and not guard.tripped
    for _ in range(10):
        assert not guard.observe(True, "bad")  # ignored
    results = [guard.observe(True, None) for _ in range(10)]
    assert results[-1]  # unparseable input from nobody: the global halt


def test_too_many_quarantined_tenants_halt() -> None:
    guard = DeadLetterGuard(window=4, share=0.5, max_quarantined=2)
    for tenant in ("t1", "t2", "t3"):
        for _ in range(4):
            guard.observe(True, tenant)
    assert list(guard.quarantined) == ["t1", "t2"] and guard.tripped


# --- the window as a ring gives what the first implementation (a deque of pairs) gave -------------


class DequeGuard:
    """The guard as first written: a deque of (dead, tenant) pairs (the reference)."""

    def __init__(self, window: int, share: float, max_quarantined: int = 10) -> None:
        self.window, self.share, self.max_quarantined = window, share, max_quarantined
        self.seen: deque[tuple[bool, str | None]] = deque()
        self.dead = 0
        self.dead_by_tenant: Counter[str] = Counter()
        self.tripped = False
        self.quarantined: dict[str, None] = {}

    def observe(self, dead: bool, tenant: str | None) -> bool:
        if tenant is not None and tenant in self.quarantined:
            return self.tripped
        self.seen.append((dead, tenant))
        if dead:
            self.dead += 1
            if tenant is not None:
                self.dead_by_tenant[tenant] += 1
        if len(self.seen) > self.window:
            old_dead, old_tenant = self.seen.popleft()
            if old_dead:
                self.dead -= 1
                if old_tenant is not None:
                    self.dead_by_tenant[old_tenant] -= 1
        if len(self.seen) >= self.window and self.dead > self.share * self.window:
            worst, count = self.dead_by_tenant.most_common(1)[0] if self.dead_by_tenant else (None, 0)
            alone = worst is not None and self.dead - count <= self.share * self.window
            if not alone or worst is None or len(self.quarantined) >= self.max_quarantined:
                self.tripped = True
            else:
                self.quarantined[worst] = None
                self.seen = deque((d, t) for d, t in self.seen if t != worst)
                self.dead = sum(d for d, _ in self.seen)
                del self.dead_by_tenant[worst]
        return self.tripped


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 12),
    st.sampled_from([0.25, 0.5, 0.9]),
    st.integers(0, 3),
    st.lists(st.tuples(st.booleans(), st.sampled_from([None, "a", "b", "c", "d"])), max_size=80),
)
def test_the_ring_window_judges_as_the_deque_of_pairs_did(
    window: int, share: float, max_quarantined: int, messages: list[tuple[bool, str | None]]
) -> None:
    guard, reference = DeadLetterGuard(window, share, max_quarantined), DequeGuard(window, share, max_quarantined)
    for dead, tenant in messages:
        assert guard.observe(dead, tenant) == reference.observe(dead, tenant)
        assert list(guard.quarantined) == list(reference.quarantined) == guard.newly_quarantined
        assert guard.dead_letters == reference.dead
        assert guard.dead_share == (reference.dead / len(reference.seen) if reference.seen else 0.0)
