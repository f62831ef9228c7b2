"""OffsetCursors: how the join tells next / replayed / skipped offsets apart, and when a partition stalls."""

from __future__ import annotations

from streams.core.cursors import OffsetCursors


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_classifies_against_the_committed_start() -> None:
    c = OffsetCursors(Clock())
    assert not c.known(3)
    c.start(3, 40)
    assert c.known(3)
    assert [c.classify(3, o) for o in (39, 40, 41)] == ["replay", "next", "gap"]
    c.advance(3, 40)
    assert c.next_offset(3) == 41
    c.advance(3, 45)  # folded after a repaired gap
    assert c.classify(3, 44) == "replay"
    assert c.classify(3, 46) == "next"


def test_a_kept_partition_keeps_its_cursor_and_a_moved_on_one_jumps() -> None:
    c = OffsetCursors(Clock())
    c.start(0, 10)
    c.advance(0, 19)
    c.start(0, 15)  # rebalance: commits trail what this worker folded
    assert c.next_offset(0) == 20
    c.start(0, 50)  # another worker moved the partition on meanwhile
    assert c.next_offset(0) == 50
    c.forget([0])
    assert not c.known(0)
    assert c.partitions() == []


def test_advance_never_moves_back() -> None:
    c = OffsetCursors(Clock())
    c.start(1, 0)
    c.advance(1, 9)
    c.advance(1, 3)
    assert c.next_offset(1) == 10


def test_stall_needs_a_backlog_and_time_without_progress() -> None:
    clock = Clock()
    c = OffsetCursors(clock)
    assert not c.stalled(2, 10, 15.0)  # unknown partition
    c.start(2, 5)
    clock.now += 20
    assert not c.stalled(2, 5, 15.0)  # nothing waiting
    assert not c.stalled(2, None, 15.0)  # log end unknown
    assert c.stalled(2, 8, 15.0)
    c.touch(2)  # a repair was asked for: wait a full period again
    assert not c.stalled(2, 8, 15.0)
    clock.now += 15
    assert c.stalled(2, 8, 15.0)
    c.advance(2, 5)
    assert not c.stalled(2, 8, 15.0)
