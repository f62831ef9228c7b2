"""Loopback ports for the processes we start: the local broker, the demo's workers, replay, the tests.

The usual trick, ``bind((host, 0))`` then close, takes a port from the kernel's ephemeral range and gives it
back at once: the kernel may hand the same port to the next such call before the first process has bound it
(in CI a writer and a join started a moment apart got the same metrics port, and the writer exited on
EADDRINUSE), and every outgoing connection takes its source port from that range as well.

So :func:`free_port` takes ports *below* the ephemeral range, never hands one out twice in a process, and
only hands out one it could bind just now. Each pytest-xdist worker has its own block of that space and each
process starts at a random place in its block, so processes started side by side rarely even look at the
same ports. Where the ephemeral range leaves too little room below it, it falls back to the kernel's choice,
still never twice.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

_LOWEST = 10_000
_BLOCK = 1_000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_lock = threading.Lock()
_handed_out: set[int] = set()
_next: int | None = None


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
