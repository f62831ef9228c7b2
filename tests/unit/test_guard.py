from collections import Counter, deque
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.guard import PARTITION, PRODUCER, TENANT, DeadLetterGuard, Source

T = TypeVar("T", str, int, tuple[int, str])


def test_guard_needs_a_full_window_before_it_acts() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    assert not any(guard.observe(True) for _ in range(5))
    assert guard.dead_share == 1.0 and not guard.quarantined


def test_guard_acts_above_the_share_only() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    for i in range(10):
        guard.observe(i % 2 == 0, None, 0)  # exactly 50 %: not above
    guard.observe(True, None, 0)  # slides out a dead one: still 5 of 10
    assert not guard.quarantined
    guard.observe(True, None, 0)  # 6 of the last 10
    assert list(guard.quarantined) == [Source(PRODUCER, "", 0)]


def test_guard_window_slides() -> None:
    guard = DeadLetterGuard(window=4, share=0.5)
    for dead in (True, True, False, False, False, False, True, True):
        assert not guard.observe(dead)
    assert guard.dead_letters == 2 and not guard.quarantined


# --- one tenant's bad deploy: that tenant ----------------------------------------------------------


def test_one_tenants_bad_deploy_quarantines_it_and_never_halts() -> None:
    guard = DeadLetterGuard(window=100, share=0.5)
    for i in range(1_000):
        tenant = ("bad", "good-a", "good-b", "good-c")[i % 4] if i < 200 else ("bad" if i % 4 else "good-a")
        guard.observe(tenant == "bad", tenant, i % 8)  # bad: 75 % of the traffic, all invalid, every partition
    assert list(guard.quarantined) == [Source(TENANT, "bad")] == guard.newly_quarantined
    assert not guard.tripped and guard.dead_letters == 0
    assert guard.is_quarantined("bad", 5) and not guard.is_quarantined("good-a", 5)


def test_a_quarantined_tenant_no_longer_counts_and_the_rest_is_still_watched() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    for _ in range(10):
        guard.observe(True, "bad", 1)
    assert list(guard.quarantined) == [Source(TENANT, "bad")]
    assert all(guard.observe(True, "bad", 1) for _ in range(10))  # its messages: out of the window
    for _ in range(10):
        assert not guard.observe(True, None, 2)  # unparseable input on partition 2: its own source
    assert list(guard.quarantined) == [Source(TENANT, "bad"), Source(PRODUCER, "", 2)]
    assert not guard.tripped


# --- the issue 27 floods: bytes without a tenant, sprayed tenant ids --------------------------------


def test_unparseable_bytes_on_one_partition_quarantine_that_producer_not_everyone() -> None:
    guard = DeadLetterGuard(window=1_000, share=0.5)
    for i in range(2_000):
        guard.observe(False, f"good-{i % 5}", i % 8)
        if i >= 1_000:  # 2,000 messages that do not parse, on partition 3
            guard.observe(True, None, 3)
            guard.observe(True, None, 3)
    assert list(guard.quarantined) == [Source(PRODUCER, "", 3)]
    assert not guard.tripped
    assert guard.is_quarantined(None, 3) and not guard.is_quarantined(None, 4)
    assert not guard.is_quarantined(None, 3, "svc-a")  # a producer that names itself is its own source


def test_sprayed_tenant_ids_from_one_producer_quarantine_the_producer() -> None:
    guard = DeadLetterGuard(window=1_000, share=0.5)
    for i in range(1_500):
        guard.observe(False, "victim", i % 8, "svc-good")
        if i >= 800:  # 1,400 invalid events over 50 made-up tenant ids, from one producer
            guard.observe(True, f"made-up-{i % 50}", 5, "sprayer")
            guard.observe(True, f"made-up-{(i + 25) % 50}", 5, "sprayer")
    assert list(guard.quarantined) == [Source(PRODUCER, "sprayer", 5)]
    assert guard.is_quarantined("made-up-7", 5, "sprayer")
    assert not guard.is_quarantined("victim", 5, "svc-good")
    assert Source(PRODUCER, "sprayer", 5).describe() == "partition 5 producer 'sprayer'"


def test_producer_headers_sprayed_widen_to_the_partition() -> None:
    guard = DeadLetterGuard(window=100, share=0.5, max_quarantined=2)
    for i in range(2_000):
        guard.observe(False, "victim", i % 8)
        guard.observe(True, None, 6, f"fake-{i % 40}")  # no producer alone explains it
        guard.observe(True, None, 6, f"fake-{(i + 20) % 40}")
    assert list(guard.quarantined)[-1] == Source(PARTITION, "", 6)
    assert [s.kind for s in guard.quarantined] == [PRODUCER, PRODUCER, PARTITION]


def test_every_partition_broken_quarantines_partitions_one_by_one_and_never_halts() -> None:
    guard = DeadLetterGuard(window=80, share=0.5)
    for i in range(4_000):
        guard.observe(True, None, i % 8, f"p{i % 8}-{i % 13}")
    assert not guard.tripped
    assert {s.partition for s in guard.quarantined} == set(range(8))


def test_too_many_quarantined_tenants_widen_to_the_producer() -> None:
    guard = DeadLetterGuard(window=4, share=0.5, max_quarantined=2)
    for tenant in ("t1", "t2", "t3"):
        for _ in range(4):
            guard.observe(True, tenant, 0, "svc")
    assert list(guard.quarantined) == [Source(TENANT, "t1"), Source(TENANT, "t2"), Source(PRODUCER, "svc", 0)]
    assert not guard.tripped


# --- release ----------------------------------------------------------------------------------------


def test_a_fixed_source_is_released_after_release_after_messages_without_a_dead_letter() -> None:
    guard = DeadLetterGuard(window=10, share=0.5, release_after=50)
    for _ in range(10):
        guard.observe(True, None, 3)
    assert list(guard.quarantined) == [Source(PRODUCER, "", 3)]
    guard.newly_quarantined.clear()
    for i in range(40):
        guard.observe(i == 20, None, 3)  # still one dead letter: renews the quarantine
    assert guard.quarantined and not guard.released
    for _ in range(60):
        guard.observe(False, None, 3)
    assert not guard.quarantined and guard.released == [Source(PRODUCER, "", 3)]
    for _ in range(10):
        guard.observe(True, None, 3)  # floods again: quarantined again
    assert guard.newly_quarantined == [Source(PRODUCER, "", 3)]


def test_the_default_release_is_five_windows() -> None:
    guard = DeadLetterGuard(window=10, share=0.5)
    for _ in range(10):
        guard.observe(True, "bad", 0)
    for _ in range(49):
        guard.observe(False, "good", 0)
    assert guard.quarantined
    for _ in range(20):
        guard.observe(False, "good", 0)
    assert not guard.quarantined and guard.released == [Source(TENANT, "bad")]


# --- the ring window judges as a plain list of messages does -----------------------------------------


def worst(counts: Counter[T]) -> tuple[T, int]:
    most = max(counts.values())
    return min(k for k, c in counts.items() if c == most), most


class ListGuard:
    """The guard written the obvious way: a deque of messages, every count recomputed (the reference)."""

    def __init__(self, window: int, share: float, max_quarantined: int, release_after: int) -> None:
        self.window, self.share = window, share
        self.max_quarantined, self.release_after = max_quarantined, release_after
        self.seen: deque[tuple[bool, str | None, int, str]] = deque()
        self.quarantined: dict[Source, int] = {}
        self.n = 0

    def matches(self, source: Source, tenant: str | None, partition: int, producer: str) -> bool:
        if source.kind == TENANT:
            return tenant == source.name
        if source.kind == PRODUCER:
            return (partition, producer) == (source.partition, source.name)
        return partition == source.partition

    def observe(self, dead: bool, tenant: str | None, partition: int, producer: str | None) -> bool:
        self.n += 1
        prod = producer or ""
        if self.quarantined and self.n % self.window == 0:
            for source, last in list(self.quarantined.items()):
                if last <= self.n - self.release_after:
                    del self.quarantined[source]
        hits = [s for s in self.quarantined if self.matches(s, tenant, partition, prod)]
        if hits:
            if dead:
                for s in hits:
                    self.quarantined[s] = self.n
            return True
        self.seen.append((dead, tenant, partition, prod))
        if len(self.seen) > self.window:
            self.seen.popleft()
        dead_ones = [m for m in self.seen if m[0]]
        if len(self.seen) >= self.window and len(dead_ones) > self.share * self.window:
            self.judge(dead_ones)
        return False

    def judge(self, dead_ones: list[tuple[bool, str | None, int, str]]) -> None:
        kinds = Counter(s.kind for s in self.quarantined)
        tenants = Counter(t for _, t, _, _ in dead_ones if t is not None)
        producers = Counter((p, prod) for _, _, p, prod in dead_ones)
        (tenant, by_tenant) = worst(tenants) if tenants else (None, 0)
        (partition, producer), by_producer = worst(producers)
        if tenant is not None and by_tenant >= by_producer and kinds[TENANT] < self.max_quarantined:
            source = Source(TENANT, tenant)
        elif kinds[PRODUCER] < self.max_quarantined:
            source = Source(PRODUCER, producer, partition)
        else:
            source = Source(PARTITION, "", worst(Counter(p for _, _, p, _ in dead_ones))[0])
        self.quarantined[source] = self.n
        self.seen = deque(m for m in self.seen if not self.matches(source, m[1], m[2], m[3]))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 12),
    st.sampled_from([0.25, 0.5, 0.9]),
    st.integers(0, 3),
    st.integers(3, 30),
    st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from([None, "a", "b", "c", "d"]),
            st.integers(0, 2),
            st.sampled_from([None, "x", "y"]),
        ),
        max_size=120,
    ),
)
def test_the_ring_window_judges_as_a_list_of_messages_does(
    window: int,
    share: float,
    max_quarantined: int,
    release_after: int,
    messages: list[tuple[bool, str | None, int, str | None]],
) -> None:
    guard = DeadLetterGuard(window, share, max_quarantined, release_after)
    reference = ListGuard(window, share, max_quarantined, release_after)
    for dead, tenant, partition, producer in messages:
        assert guard.observe(dead, tenant, partition, producer) == reference.observe(dead, tenant, partition, producer)
        assert list(guard.quarantined) == list(reference.quarantined)
        assert guard.dead_letters == sum(m[0] for m in reference.seen)
