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
