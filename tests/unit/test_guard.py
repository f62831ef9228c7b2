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
