"""How a window's held records reach the close process without stalling the writer.

Passed as an argument, the window's records (160,000 of them are ~120 MB) are pickled in one call by the
executor's feeder thread, which holds the GIL throughout: the writer's event loop (its commits, its
``/metrics``) stood still for 0.9-1.1 s at the start of such a close when the host was busy (bench
``closeburst`` after ``memory``), against 0.1 s for the same pickling on an idle one.

Here the records are written instead, a few thousand at a time, into an anonymous in-memory file
(``memfd_create``): each write releases the GIL, so the loop runs between them. The close process opens the
file through ``/proc/<writer pid>/fd/<fd>`` and reads the records as slices of one buffer. The writer closes
the file once the close process answered, so nothing is left behind, even after a ``kill -9``. Where either
is missing (not Linux), :func:`spool` returns None and the records are passed as before.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

#: Records joined per write: ~3 MB at the sizes of a request record, about a millisecond with the GIL held.
SPOOL_CHUNK = 4_096


@dataclass(frozen=True)
class Spooled:
    """A handle the close process can open: the file's path and each record's length, in order."""

    path: str
    lengths: array  # type: ignore[type-arg]


def spool(blobs: Sequence[bytes]) -> tuple[int, Spooled] | None:
    """Write ``blobs`` to a new in-memory file; its descriptor (close it once read) and a handle, or None
    where this host has no ``memfd_create`` or ``/proc``, or refuses the file (a sandbox, a memory limit)."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.memfd_create("ttft-window-records")
    except OSError:
        return None
    try:
        with open(fd, "wb", closefd=False) as out:
            for start in range(0, len(blobs), SPOOL_CHUNK):
                out.write(b"".join(blobs[start : start + SPOOL_CHUNK]))
    except OSError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd, Spooled(f"/proc/{os.getpid()}/fd/{fd}", array("q", map(len, blobs)))


def release(fd: int) -> None:
    """Close a spooled file (its memory goes with the last descriptor)."""
    with contextlib.suppress(OSError):
        os.close(fd)


def read_spooled(spooled: Spooled) -> list[memoryview]:
    """The records of a spooled file, as slices of one buffer (orjson reads a memoryview as it is)."""
    with open(spooled.path, "rb") as f:
        data = memoryview(f.read())
    out: list[memoryview] = []
    pos = 0
    for length in spooled.lengths:
        out.append(data[pos : pos + length])
        pos += length
    if pos != len(data):
        raise ValueError(f"spooled window records: {len(data)} bytes, the lengths add up to {pos}")
    return out
