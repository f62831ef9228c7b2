from __future__ import annotations

import subprocess
import sys

import pytest

from streams.store.shutdown import exit_status


@pytest.mark.parametrize(
    ("code", "status"),
    [(None, 0), (0, 0), (1, 1), (2, 2), (3, 3), (256 + 7, 7), (True, 1), (False, 0), ("message", 1)],
)
def test_exit_status_is_what_sys_exit_would_give(code: object, status: int) -> None:
    assert exit_status(code) == status


def test_a_process_without_the_store_exits_normally() -> None:
    script = (
        "import atexit, sys\n"
        "from streams.store.shutdown import exit_process\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "exit_process(4)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4
    assert "atexit ran" in done.stdout
