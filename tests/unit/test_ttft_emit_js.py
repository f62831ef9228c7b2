"""ttft-emit-otel, the Node helper (emitter/js), by its own ``node --test`` suite: fakes shaped as the openai Node
client and its instrumentations. The real client under the three real instrumentations is captured with it
(tests/data/otel_instrumentations/openai_node, ``--helper``) and read by test_otlp_providers.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

JS = Path(__file__).resolve().parents[2] / "emitter" / "js"


def test_the_node_helpers_own_suite_passes() -> None:
    node = shutil.which("node")
    assert node, "node is needed for emitter/js (Node >= 18): install the nodejs package"
    done = subprocess.run([node, "--test", "test/"], cwd=JS, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    counts = dict(re.findall(r"^# (tests|pass|fail) (\d+)$", done.stdout, re.MULTILINE))
    assert counts.get("fail") == "0" and int(counts.get("pass", 0)) >= 8 and counts["pass"] == counts["tests"]
