"""Run instrumented services (``tests/support/instrumented_rag.py``, ``framework_rag.py``) side by side, each in
its own process of an instrumentation venv, exporting to one Collector; collect what each wrote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.fixtures.otel import OtelCollectorHandle
from tests.support.pipeline import REPO


def run_services(
    python: Path,
    runner: Path,
    services: dict[str, tuple[str, bool]],
    handle: OtelCollectorHandle,
    out: Path,
    *,
    tenant_prefix: str,
    requests: int,
    timeout_s: float,
) -> dict[str, dict[str, Any]]:
    """``services``: name -> (library, with ttft-emit's first-chunk helper); the tenant is ``<prefix><name>``.
    Returns each service's ``--out`` document, after every process exited 0."""
    procs = {}
    for service, (library, helper) in services.items():
        cmd = [str(python), str(runner), "--library", library, "--endpoint", handle.collector.http_endpoint]
        cmd += ["--tenant", f"{tenant_prefix}{service}", "--requests", str(requests)]
        cmd += ["--out", str(out / f"{service}.json")]
        cmd += ["--first-chunk-helper"] if helper else []
        procs[service] = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for service, proc in procs.items():
        output, _ = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, f"{service}: {output[-3000:]}"
    return {service: json.loads((out / f"{service}.json").read_text()) for service in services}
