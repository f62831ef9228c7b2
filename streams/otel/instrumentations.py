"""The venv of the real OpenAI instrumentations (``tests/data/otel_instrumentations/requirements.txt``).

Used by issue 25's acceptance test (real instrumentations through the Collector) and by ``ttft demo --otel``
(its OpenTelemetry tenant is a service traced by one of them, :mod:`streams.demo.instrumented_service`);
``make demo DEMO_ARGS=--otel`` builds it (``python -m streams.otel.instrumentations``), ``make demo`` does not.

The instrumentations patch the same ``openai`` client and pin versions of their own, so they never go into
the project's venv (``pyproject.toml``): they live in a venv of their own under ``.cache/``, named by the
SHA-256 of the requirements file, built once (a changed file builds a new one) and kept across runs. Two
processes asking at once (pytest-xdist workers) build it once: the second waits on a lock file. A build that
died half-way has no ``.complete`` marker and is built again from scratch.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
REQUIREMENTS: Final = REPO / "tests" / "data" / "otel_instrumentations" / "requirements.txt"
VENVS: Final = REPO / ".cache" / "otel-instrumentations"
_MARKER: Final = ".complete"


def venv_dir(requirements: Path = REQUIREMENTS, root: Path = VENVS) -> Path:
    """Where the venv of ``requirements`` lives: ``root/<first 16 hex digits of its SHA-256>``."""
    return root / hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]


def instrumentation_python(requirements: Path = REQUIREMENTS, root: Path = VENVS, timeout_s: float = 600.0) -> Path:
    """The python of the venv of ``requirements``, built first if it is not there yet (raises
    ``subprocess.CalledProcessError`` when pip fails: the libraries could not be installed)."""
    venv = venv_dir(requirements, root)
    python = venv / "bin" / "python"
    if (venv / _MARKER).exists():
        return python
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (venv / _MARKER).exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "-r", str(requirements)], check=True, timeout=timeout_s)
        (venv / _MARKER).write_text(requirements.read_text())
    return python


def is_built(requirements: Path = REQUIREMENTS, root: Path = VENVS) -> bool:
    """Whether the venv of ``requirements`` is complete (nothing to install)."""
    return (venv_dir(requirements, root) / _MARKER).exists()


if __name__ == "__main__":
    print(instrumentation_python())
