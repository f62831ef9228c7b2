"""The writer's own copy of each open window's records, so a close need not read them back from the store.

Every record the writer inserts is also kept here, serialised (``orjson``), under its window and its
``(tenant_id, request_id)``, with the ``FINAL`` rule of the ``requests`` table: the highest
``record_version`` wins, and of equal versions the later one. When the window closes, the copy is used only
if its fingerprint (record count, sum of record versions) equals the store's; otherwise (a restart that
lost the memory, a second writer owning other partitions, a spilled window) the close reads the store as
before. So the copy can only save a read, never change a result.

A window stops being held (``spilled``) once the held records of all windows would pass
``windows.held_records_max``; its close reads the store.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from streams.app.arms import arms_from_records
from streams.app.window_handoff import Spooled, read_spooled
from streams.core.series import Series, SeriesAdmission
from streams.core.windows import WindowAggregates, aggregate_window
from streams.settings import Settings
from streams.store.requests_store import request_key, store_form

Fingerprint = tuple[int, int]
#: ``id(record) -> (record, the JSON it was decoded from)``: what the writer read, for WindowMemory.add.
Serialised = Mapping[int, tuple[dict[str, Any], bytes]]


class _Held:
    __slots__ = ("records", "version_sum")

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], tuple[int, bytes]] = {}
        self.version_sum = 0


class WindowMemory:
    """Serialised records per open window (see the module docstring)."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._windows: dict[int, _Held] = {}
        self._spilled: set[int] = set()
        self.held_records = 0

    def add(self, records: Iterable[dict[str, Any]], serialised: Serialised | None = None) -> None:
        """Keep each record under its window (records of windows already taken must not be passed).

        ``serialised`` maps ``id(record)`` to ``(record, the JSON it was decoded from)`` (the Kafka message);
        those bytes are kept as they are: encoding the record again would cost the writer about as much as
        decoding it did. A record not in it (or another object under its id) is encoded here.
        """
        blobs = serialised or {}
        for record in records:
            ws = int(record["window_start"])
            if ws in self._spilled:
                continue
            held = self._windows.get(ws)
            if held is None:
                held = self._windows[ws] = _Held()
            key = request_key(record)
            version = int(record["record_version"])
            old = held.records.get(key)
            if old is not None:
                if version < old[0]:
                    continue
                held.version_sum -= old[0]
                self.held_records -= 1
            elif self.held_records >= self.max_records:
                self.spill(ws)
                continue
            source = blobs.get(id(record))
            blob = source[1] if source is not None and source[0] is record else None
            if blob is None:
                # An exact-size copy: orjson's output keeps its whole write buffer allocated (~16 KB a record).
                blob = memoryview(orjson.dumps(record)).tobytes()
            held.records[key] = (version, blob)
            held.version_sum += version
            self.held_records += 1

    def spill(self, ws: int) -> None:
        """Stop holding window ``ws``: its close reads the store."""
        held = self._windows.pop(ws, None)
        if held is not None:
            self.held_records -= len(held.records)
        self._spilled.add(ws)

    def fingerprint(self, ws: int) -> Fingerprint | None:
        """(count, sum of record versions) of the held records, None when the window is not held."""
        held = self._windows.get(ws)
        if held is None:
            return None
        return len(held.records), held.version_sum

    def take(self, ws: int) -> list[bytes] | None:
        """Remove window ``ws`` and return its serialised records (None when it was not held)."""
        self._spilled.discard(ws)
        held = self._windows.pop(ws, None)
        if held is None:
            return None
        self.held_records -= len(held.records)
        return [blob for _, blob in held.records.values()]

    def forget(self, windows: Iterable[int]) -> None:
        for ws in windows:
            self.take(ws)

    def windows(self) -> set[int]:
        return set(self._windows) | self._spilled


def decode_held(blobs: Sequence[bytes | memoryview]) -> list[dict[str, Any]]:
    """The held records as the store returns them (times rounded to the millisecond, defaults filled):
    the same input :func:`streams.core.windows.aggregate_window` gets from ``requests FINAL``."""
    return [store_form(orjson.loads(blob)) for blob in blobs]


def aggregate_held(
    blobs: Sequence[bytes | memoryview],
    ws: int,
    settings: Settings,
    admission: SeriesAdmission,
    dead_letters: dict[Any, int],
    amendments: int,
    pinned: list[Series],
) -> tuple[WindowAggregates, dict[Any, str]]:
    """A window's aggregates and canary arms from its held records; runs in the close process, so only
    the serialised records cross the process boundary and the writer's event loop never waits on it."""
    records = decode_held(blobs)
    agg = aggregate_window(
        records,
        ws,
        settings,
        admission=admission,
        dead_letters=dead_letters,
        amendments=amendments,
        pinned_series=pinned,
    )
    return agg, arms_from_records(records, settings)


def aggregate_spooled(spooled: Spooled, *args: Any) -> tuple[WindowAggregates, dict[Any, str]]:
    """:func:`aggregate_held` of records the writer spooled (:mod:`streams.app.window_handoff`)."""
    return aggregate_held(read_spooled(spooled), *args)


_PR_SET_PDEATHSIG = 1


#: The close process yields the CPU to the writer, the join and the broker: closing is background work.
CLOSE_PROCESS_NICE = 10


def close_process_init(parent: int) -> None:
    """Initializer of the close process: a lower CPU priority, SIGKILLed when the writer dies, even by
    ``kill -9`` (Linux ``prctl``), and gone at once if the writer died before this ran."""
    with contextlib.suppress(OSError):
        os.nice(CLOSE_PROCESS_NICE)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the executor's shutdown still ends it
        return
    if os.getppid() != parent:
        os._exit(1)
