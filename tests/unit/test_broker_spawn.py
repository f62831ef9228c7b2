"""The local broker's JVMs get an explicit environment (no race with another thread's ``setenv``).

CI once failed two fault-lab set-ups with ``OSError: [Errno 14] Bad address: '/usr/bin/java'``: the lab starts
brokers from worker threads while tests in the main thread set environment variables, and a child that
execs with the C ``environ`` array can read it mid-move. An explicit ``env=`` is built before the fork.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from streams.kafka import broker as broker_mod


def test_storage_format_and_launch_pass_an_explicit_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(kwargs)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    class FakePopen:
        pid = 4242

        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            calls.append(kwargs)

    monkeypatch.setattr(broker_mod.subprocess, "run", fake_run)
    monkeypatch.setattr(broker_mod.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("TTFT_SPAWN_PROBE", "1")
    broker = broker_mod.LocalBroker(tmp_path / "kafka", port=19092, controller_port=19093, libs=tmp_path / "libs")
    broker.data_dir.mkdir(parents=True)
    broker._write_config()
    broker._format_storage()
    broker._launch()
    assert len(calls) == 2
    for kwargs in calls:
        assert isinstance(kwargs.get("env"), dict)
        assert kwargs["env"]["TTFT_SPAWN_PROBE"] == "1"
