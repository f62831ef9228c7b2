"""A wheel that works: built from the checkout (sdist, then wheel), installed into a fresh venv outside the
checkout, it applies its migrations to a fresh embedded store, starts ``ttft worker --help`` and answers
``ttft breakdown --json``; the data files it ships are byte for byte the repository's."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from streams.resources import SHIPPED

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tests" / "support" / "wheel_check.py"


def test_the_wheel_installs_outside_the_checkout_and_runs_against_a_fresh_store(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"wheel check: {report['total_seconds']} s, steps {report['seconds']}")
    outputs = report["outputs"]

    assert "/site-packages/streams/" in report["streams_file"] and str(REPO) not in report["streams_file"]
    assert {w.split("-")[0] for w in report["wheels"]} == {"ttft_pipeline", "ttft_emit"}

    # The data files: exactly the checkout's (as snapshotted for the build), byte for byte.
    assert (report["shipped_missing"], report["shipped_extra"], report["shipped_differ"]) == ([], [], [])
    assert {name.split("/")[0] for name in report["shipped"]} == set(SHIPPED)

    versions = f"ttft {version('ttft-pipeline')} (ttft-emit {version('ttft-emit')}, Python 3.11"
    assert outputs["ttft --version"].startswith(versions)
    migrations = sorted(p.stem for p in (REPO / SHIPPED["migrations"][0]).glob("*.sql"))
    applied = [line.split()[1] for line in outputs["db migrate"].splitlines() if line.startswith("applied ")]
    assert applied == migrations
    assert outputs["db migrate again"].strip().endswith("up to date")
    assert "--role" in outputs["worker --help"]

    breakdown = json.loads(outputs["breakdown --json"])
    assert breakdown and {b["tenant"] for b in breakdown} >= {"acme"}
    assert all(b["stages"] for b in breakdown)
