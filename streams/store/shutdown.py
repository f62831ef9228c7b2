"""How a process that opened the embedded store ends: ours closed in order, chDB's teardown skipped.

Why. chDB's engine lives in this process. Its native teardown, which runs after the interpreter has
finalised (C++ static destructors and the engine's global shutdown), sometimes dies with SIGSEGV: seen
as exit status 139 after every test had passed, and after ``ttft breakdown`` had printed its answer.
Python's exit status is lost with it. The crash happens even when every chDB connection was closed
first, so closing alone cannot avoid it (docs/operations.md, "Exit status and the embedded store").

What. :func:`end_process` is the last thing such a process does: it closes every chDB client this
process opened (unshared ones first, then the shared one; inserts are synchronous, so nothing of ours is
in flight by then), flushes logging and the standard streams, and calls ``os._exit`` with the real
status. Every durable effect has happened before: inserts returned, Kafka offsets were committed by the
code that owns them. A process that never opened chDB (the supervisor, a join worker, an HTTP store)
ends normally.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import NoReturn

from streams.store import client as store_client

log = logging.getLogger(__name__)

#: How long closing the clients may take before the process ends anyway (a call stuck in the engine
#: must not turn a clean stop into a hang).
CLOSE_TIMEOUT_S = 10.0


def store_opened() -> bool:
    """True once this process has opened a chDB client (its native teardown would then run at exit)."""
    return store_client.chdb_path_in_use() is not None


def exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` would give: ``None`` is 0, an int is itself, anything else 1."""
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    return 1


def close_stores(timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """Close every chDB client of this process; False if that did not finish within ``timeout_s``."""
    closer = threading.Thread(target=store_client.close_chdb_clients, name="close-chdb", daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        log.warning("closing the embedded store took more than %.0f s; ending the process anyway", timeout_s)
        return False
    return True


def end_process(status: int) -> NoReturn:
    """Close our stores, flush, and end with ``status`` without running chDB's native teardown."""
    close_stores()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def exit_process(status: int = 0) -> NoReturn:
    """``sys.exit(status)``, or :func:`end_process` if this process opened the embedded store."""
    if store_opened():
        end_process(status)
    sys.exit(status)
