"""Optional second peer: the same join written with Quix Streams. Skipped unless it installs cleanly.

``pip install quixstreams`` (3.28) into the project venv is not clean: it upgrades pydantic,
pydantic-core and pydantic-settings under the pipeline's feet. So the peer only runs when a separate
interpreter with Quix Streams is named by ``BENCH_QUIX_PYTHON``; otherwise the run records why it
was skipped and the figure stays "not measured".
"""

from __future__ import annotations

import os
import shutil
from typing import Any


def quix_python() -> str | None:
    """The interpreter that has Quix Streams, if one was provided."""
    path = os.environ.get("BENCH_QUIX_PYTHON")
    return path if path and shutil.which(path) else None


def measure_quix() -> dict[str, Any]:
    """Skip record (the Quix peer needs its own interpreter; see the module docstring)."""
    reason = (
        "BENCH_QUIX_PYTHON is set but the Quix peer app is not written yet"
        if quix_python()
        else "quixstreams 3.28 would upgrade pydantic/pydantic-settings in the project venv; not installed"
    )
    return {"figures": {"quix_events_per_s": None}, "details": {"skipped": reason}}
