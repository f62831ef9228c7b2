from __future__ import annotations

import threading

import pytest

from ttft_emit.buffer import EventBuffer


def _msg(i: int) -> tuple[bytes, bytes, int]:
    return (f"k{i}".encode(), f"v{i}".encode(), i)


def test_a_full_buffer_evicts_its_oldest_message_and_counts_it() -> None:
    buffer = EventBuffer(3)
    buffer.open()
    for i in range(5):
        buffer.put(*_msg(i))
    assert buffer.messages() == [(b"k2", b"v2"), (b"k3", b"v3"), (b"k4", b"v4")]
    stats = buffer.stats(connected=False)
    assert (stats.queued, stats.dropped) == (3, 2)


def test_messages_offered_while_closed_are_dropped_and_counted() -> None:
    buffer = EventBuffer(3)
    buffer.put(*_msg(0))
    buffer.open()
    buffer.put(*_msg(1))
    buffer.close()
    buffer.put(*_msg(2))
    assert buffer.messages() == [(b"k1", b"v1")]
    assert buffer.stats(connected=False).dropped == 2


def test_retries_go_first_and_a_full_buffer_still_evicts_only_its_own_oldest() -> None:
    buffer = EventBuffer(4)
    buffer.open()
    for i in range(4):
        buffer.put(*_msg(i))
    batch = buffer.take(3)
    assert [m[2] for m in batch] == [0, 1, 2]
    for i in range(4, 8):
        buffer.put(*_msg(i))  # 3 is evicted by 7: the deque holds 4, 5, 6, 7 while the batch is in flight
    buffer.settle(taken=3, sent=1, invalid=1, retry=[batch[2]])
    assert [key for key, _ in buffer.messages()] == [b"k2", b"k4", b"k5", b"k6", b"k7"]
    stats = buffer.stats(connected=True)
    assert (stats.queued, stats.sent, stats.invalid, stats.dropped) == (5, 1, 1, 1)
    assert [m[2] for m in buffer.take(2)] == [2, 4]


def test_discard_counts_what_is_buffered_waiting_for_a_retry_and_in_flight() -> None:
    buffer = EventBuffer(10)
    buffer.open()
    for i in range(6):
        buffer.put(*_msg(i))
    first = buffer.take(1)
    buffer.settle(1, sent=0, invalid=0, retry=first)
    buffer.take(2)
    assert buffer.discard() == 6
    stats = buffer.stats(connected=False)
    assert (stats.queued, stats.sent, stats.dropped) == (0, 0, 6)
    assert len(buffer) == 0


def test_invalid_events_are_counted() -> None:
    buffer = EventBuffer(10)
    buffer.count_invalid()
    buffer.settle(0, sent=0, invalid=2, retry=[])
    assert buffer.stats(connected=False).invalid == 3


def test_counts_are_exact_with_many_threads_offering_at_once_and_a_sender_draining() -> None:
    buffer = EventBuffer(1_000)
    buffer.open()
    per_thread, threads = 20_000, 8
    sent = [0]
    done = threading.Event()

    def drain() -> None:  # a sender taking and settling batches meanwhile
        while not done.is_set() or len(buffer):
            batch = buffer.take(64)
            half = (len(batch) + 1) // 2
            buffer.settle(len(batch), sent=half, invalid=0, retry=batch[half:])
            sent[0] += half

    def offer(t: int) -> None:
        for i in range(per_thread):
            buffer.put(b"k", b"v", t * per_thread + i)

    drainer = threading.Thread(target=drain)
    drainer.start()
    workers = [threading.Thread(target=offer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    drainer.join(30)
    stats = buffer.stats(connected=False)
    assert stats.queued == 0
    assert stats.sent == sent[0]
    assert stats.sent + stats.dropped == per_thread * threads


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventBuffer(0)
