"""Issue 3 through the real broker, worker and store: window sketches within 1 % of numpy."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support.pipeline import REPO

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e]


def test_stored_windows_match_numpy_through_the_real_pipeline(pipeline_run: Any) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "tests/support/window_check.py")],
        env=pipeline_run.env,
        cwd=REPO,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    report = json.loads(out.stdout.decode().strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report["requests"] >= 20_000
    assert report["count_mismatch"] == []
    assert report["checked"] >= 300
    assert report["failures"] == []
    assert report["worst_relative_error"] <= 0.01 + 1e-9
    assert report["rollup_checked"] >= 10
    assert report["rollup_failures"] == []
