"""The emitter distribution installs alone into a fresh Python 3.9 venv, pulls in aiokafka and orjson (and
their own dependencies) only, works there, and passes its own tests on that interpreter."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHECK = Path(__file__).resolve().parents[1] / "support" / "emitter_install_check.py"
#: What `pip install ./emitter` may add to a fresh venv besides its seed packages (pip, setuptools).
ALLOWED = {"ttft-emit", "aiokafka", "orjson", "async-timeout", "packaging", "typing-extensions"}


def python39() -> str:
    """A working Python 3.9: $TTFT_EMITTER_PYTHON, else pyenv's, else python3.9 on the PATH (a pyenv shim
    there may point at no installed 3.9, so each candidate is tried)."""
    candidates = [os.environ.get("TTFT_EMITTER_PYTHON", "")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")), reverse=True)
    candidates.append(shutil.which("python3.9") or "")
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        if probe.returncode == 0 and probe.stdout.strip() == b"(3, 9)":
            return candidate
    pytest.fail("no Python 3.9 for the emitter's install test: set TTFT_EMITTER_PYTHON or install python3.9")


def test_the_emitter_installs_alone_on_python_3_9_and_passes_its_tests_there(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(CHECK), "--python", python39(), "--run-tests"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["python"].startswith("3.9.")
    assert set(report["installed"]) - {"pip", "setuptools", "wheel"} == ALLOWED
    assert [line.strip().split("==")[0] for line in report["tree"] if line.count("  ") == 1] == ["aiokafka", "orjson"]
    assert report["tests"].split()[1] == "passed" and "failed" not in report["tests"]
