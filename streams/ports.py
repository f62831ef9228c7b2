"""Loopback ports for the processes we start: the local broker, the demo's workers, replay, the tests.

The usual trick, ``bind((host, 0))`` then close, takes a port from the kernel's ephemeral range and gives it
back at once: the kernel may hand the same port to the next such call before the first process has bound it
(in CI a writer and a join started a moment apart got the same metrics port, and the writer exited on
EADDRINUSE), and every outgoing connection takes its source port from that range as well.

So :func:`free_port` takes ports *below* the ephemeral range, never hands one out twice in a process, and
only hands out one it could bind just now. Each pytest-xdist worker has its own block of that space and each
process starts at a random place in its block, so processes started side by side rarely even look at the
same ports. Processes that share a block (a test and the demo it starts inherit its xdist worker) also
never hand out the same port at once: a port handed out is reserved by an advisory lock on a file named after
it (``$TMPDIR/ttft-ports-<uid>/<port>``), held until :data:`HELD` later ports have been handed out or the
process ends (the kernel drops the locks of a dead process, so nothing is left to clean up). Where the
ephemeral range leaves too little room below it, it falls back to the kernel's choice, still never twice.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import threading
from collections import deque
from pathlib import Path

_LOWEST = 10_000
_BLOCK = 1_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Where the ports' lock files live (one per port ever reserved on this host by this user, empty files).
LOCK_DIR = Path(tempfile.gettempdir()) / f"ttft-ports-{os.getuid()}"
#: How many of the latest ports a process keeps reserved (one open file each); by then the oldest is bound.
HELD = 128

_lock = threading.Lock()
_handed_out: set[int] = set()
_next: int | None = None
_held: deque[int] = deque()  # the lock files' descriptors, oldest first


def port_is_free(host: str, port: int, *, reuse_addr: bool = True) -> bool:
    """True if nothing listens on ``host:port`` (a bind succeeds); without ``reuse_addr`` a port a listener has
    just closed (TIME_WAIT) counts as taken too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago and that this process has not handed out before."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` consecutive TCP ports on ``host``, each as :func:`free_port` promises."""
    with _lock:
        block = _block()
        if block is None:
            return _kernel_ports(count, host)
        first, end = block
        global _next
        start = _next if _next is not None else first + random.randrange(end - first)
        span = end - first
        for step in range(span):
            base = first + (start - first + step) % span
            run = list(range(base, base + count))
            if run[-1] >= end or any(p in _handed_out or not _bindable(host, p) for p in run):
                continue
            if not _reserve(run):
                continue  # another process handed them out just now
            _handed_out.update(run)
            _next = run[-1] + 1
            return run
    raise RuntimeError(f"no {count} free consecutive ports in {first}..{end - 1} on {host}")


def _block() -> tuple[int, int] | None:
    """This process's block [first, end) below the ephemeral range, or None when there is no room."""
    ephemeral_low = _ephemeral_low()
    blocks = (ephemeral_low - _LOWEST) // _BLOCK
    if blocks < 1:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    first = _LOWEST + (index % blocks) * _BLOCK
    return first, first + _BLOCK


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(host: str, port: int) -> bool:
    return port_is_free(host, port, reuse_addr=False)


def _reserve(run: list[int]) -> bool:
    """Lock every port of ``run`` against the other processes of this host, or none (False: one is held by
    another process). Without a lock directory it cannot create, it reserves nothing and says yes."""
    fds: list[int] = []
    try:
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for port in run:
            fd = os.open(LOCK_DIR / str(port), os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        for fd in fds:
            os.close(fd)
        return False
    except OSError:
        for fd in fds:
            os.close(fd)
        return True
    _held.extend(fds)
    while len(_held) > HELD:
        os.close(_held.popleft())
    return True


def _kernel_ports(count: int, host: str) -> list[int]:
    for _ in range(1_000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        run = list(range(port, port + count))
        if not any(p in _handed_out for p in run) and all(_bindable(host, p) for p in run[1:]):
            _handed_out.update(run)
            return run
    raise RuntimeError(f"the kernel gave no {count} free consecutive ports on {host}")
