"""The bounded buffer between the request path and the background sender, shared by both emitters.

The request path takes no lock: :meth:`EventBuffer.put` is one ``deque.append`` (a full deque evicts its
oldest entry in the same C call) and one ``next()`` on an ``itertools.count``, each atomic under the GIL.
So a request thread never waits for the sender, for another request thread or for Kafka, whatever the
sender is doing. Evictions are not counted where they happen (that would need a lock); they are derived:
every message accepted either left the deque through the sender, or is still in it, or was evicted.

The sender side (:meth:`take`, :meth:`settle`, :meth:`discard`) runs in one thread at a time: the
sender's, or the one stopping the emitter after the sender ended. Messages that failed for a retriable
reason wait in the sender's own retry list, in front of the deque, so they count toward the memory bound
of ``max_events`` plus one batch.

At rest (no call in progress) every event offered is in exactly one of ``queued``, ``sent``, ``dropped``
and ``invalid``; a snapshot taken while requests are emitting can be off by the few being appended.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

#: (Kafka key, Kafka value, Kafka timestamp in epoch ms: when the event was buffered)
Message = tuple[bytes, bytes, int]


@dataclass(frozen=True)
class EmitterStats:
    """Counters of an emitter (events)."""

    queued: int
    """In the buffer now, waiting to be sent (retries included)."""
    sent: int
    """Acknowledged by Kafka."""
    dropped: int
    """Lost: evicted from a full buffer, refused before start/after stop, or unconfirmed at stop."""
    invalid: int
    """Not JSON-serialisable (bad attrs) or rejected by Kafka as unsendable (e.g. too large)."""
    connected: bool
    """Whether the background producer is connected right now."""


def _count_value(counter: itertools.count[int]) -> int:
    """How many times ``next()`` was called on a fresh ``itertools.count()`` (read without advancing it)."""
    return int(repr(counter)[len("count(") : -1])


class EventBuffer:
    """At most ``max_events`` messages; a full buffer evicts its oldest message (counted as dropped).

    Fresh events matter most to live dashboards and alerts, so the oldest go first.
    """

    def __init__(self, max_events: int) -> None:
        if max_events <= 0:
            raise ValueError("max_events must be positive")
        self.max_events = max_events
        self._reset()
        self._accepting = False

    def _reset(self) -> None:
        self._items: deque[Message] = deque(maxlen=self.max_events)
        # Request path: one atomic next() each.
        self._accepted = itertools.count()
        self._refused = itertools.count()
        self._unserialisable = itertools.count()
        # Sender side.
        self._retry: list[Message] = []
        self._taken = 0  # left the deque through take() or discard()
        self._in_flight = 0
        self._sent = self._rejected = self._lost = 0

    # --- the request path -------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, timestamp_ms: int) -> None:
        """Buffer one message, or count it dropped when not accepting. Takes no lock, never raises."""
        if self._accepting:
            next(self._accepted)
            self._items.append((key, value, timestamp_ms))  # evicts the oldest message when full
        else:
            next(self._refused)

    def count_invalid(self) -> None:
        """One event could not be serialised."""
        next(self._unserialisable)

    # --- lifecycle ----------------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._accepting

    def open(self) -> None:
        """Accept messages from now on."""
        self._accepting = True

    def close(self) -> None:
        """Refuse (and count as dropped) every message offered from now on."""
        self._accepting = False

    def discard(self) -> int:
        """Count everything still buffered, waiting for a retry or in flight as lost (at stop); returns how many.

        Only once the sender has ended (or from its own thread).
        """
        lost = self._in_flight + len(self._retry)
        self._retry = []
        self._in_flight = 0
        while True:
            try:
                self._items.popleft()
            except IndexError:
                break
            self._taken += 1
            lost += 1
        self._lost += lost
        return lost

    def reset_after_fork(self) -> None:
        """In a forked child: nothing inherited. The parent's messages are the parent's to send; the
        child's counters start at zero."""
        self._reset()

    # --- the sender ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items) + len(self._retry)

    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages, the ones waiting for a retry first, then the oldest; in flight until
        :meth:`settle`."""
        batch, self._retry = self._retry[:limit], self._retry[limit:]
        while len(batch) < limit:
            try:
                batch.append(self._items.popleft())
            except IndexError:
                break
            self._taken += 1
        self._in_flight += len(batch)
        return batch

    def settle(self, taken: int, sent: int, invalid: int, retry: Sequence[Message]) -> None:
        """The outcome of a batch of ``taken`` messages from :meth:`take`: ``retry`` is sent again first."""
        self._in_flight -= taken
        self._sent += sent
        self._rejected += invalid
        self._retry = [*retry, *self._retry]

    # --- reading ------------------------------------------------------------------------------------

    def stats(self, connected: bool) -> EmitterStats:
        """A snapshot of the counters (exact at rest)."""
        queued = len(self._items)
        evicted = _count_value(self._accepted) - self._taken - queued
        return EmitterStats(
            queued=queued + len(self._retry),
            sent=self._sent,
            dropped=_count_value(self._refused) + max(evicted, 0) + self._lost,
            invalid=_count_value(self._unserialisable) + self._rejected,
            connected=connected,
        )

    def messages(self) -> list[tuple[bytes, bytes]]:
        """The buffered (key, value) messages, oldest first (retries first)."""
        return [(key, value) for key, value, _ in [*self._retry, *self._items]]
