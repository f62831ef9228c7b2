"""Child processes of the demo: started in their own process group, stopped in order, never leaked.

Every child runs in a new session (so a Ctrl-C on the terminal reaches only the demo, which then stops
the children in order: join first, then the writer so it commits what it holds) and gets SIGTERM from
the kernel if the demo dies without cleaning up (``PR_SET_PDEATHSIG``). :class:`ProcessSet` stops
what it started on ``close()``, and an ``atexit`` hook does the same as a last resort; a child that
ignores SIGTERM gets SIGKILL on its whole process group (while it is still unreaped, so the group id
cannot have been reused).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel sends SIGTERM when the demo process exits.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ChildProcess:
    """One started child: its name, process and log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3_000) -> str:
        """The end of the child's log (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the whole process group. Returns the exit code (None if unknown).

        The group is killed only while the child is unreaped, so its id cannot belong to anyone else yet.
        """
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=10)
        return None


class ProcessSet:
    """The children of one demo run; :meth:`close` stops them, last started first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[ChildProcess] = []
        atexit.register(self.close)

    def start(self, name: str, cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None) -> ChildProcess:
        """Start ``cmd`` in a new session with output to ``<log_dir>/<name>.log``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                list(cmd),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # only prctl: safe between fork and exec
            )
        child = ChildProcess(name, proc, log_path)
        self.children.append(child)
        return child

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop every child still running, newest first (SIGTERM; SIGKILL to its group if it hangs)."""
        for child in reversed(self.children):
            if child.alive():
                child.stop(timeout_s)
        atexit.unregister(self.close)


def wait_http_ok(url: str, timeout_s: float, *, alive: ChildProcess | None = None, what: str = "") -> None:
    """Poll ``url`` until it answers 2xx; raises ``RuntimeError`` on timeout or if ``alive`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive.alive():
            raise RuntimeError(f"{what or alive.name} exited with {alive.proc.returncode}:\n{alive.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if 200 <= resp.status < 300:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    tail = alive.log_tail() if alive is not None else ""
    raise RuntimeError(f"{what or url} not ready after {timeout_s:.0f} s\n{tail}")
