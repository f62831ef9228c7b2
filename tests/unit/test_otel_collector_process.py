"""``LocalCollector``'s process handling, with a stand-in binary: a Python script that opens the two OTLP
ports from the environment and ignores SIGTERM, so ``stop`` must fall back to SIGKILL. The real Collector is
exercised in tests/integration/test_otel_collector.py."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from streams.otel.collector import CollectorError, LocalCollector
from tests.fixtures.otel import free_otel_ports

#: Loopback ports bound in the test process and by the stand-in binary; no real Collector.
pytestmark = pytest.mark.net

STUBBORN = f"""#!{sys.executable}
import os, signal, socket, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
socks = []
for name in ("TTFT_OTEL__GRPC_PORT", "TTFT_OTEL__HTTP_PORT"):
    s = socket.socket()
    s.bind(("127.0.0.1", int(os.environ[name])))
    s.listen()
    socks.append(s)
time.sleep(120)
"""


def _stubborn_binary(tmp_path: Path) -> Path:
    binary = tmp_path / "otelcol-stub"
    binary.write_text(STUBBORN)
    binary.chmod(0o755)
    return binary


def test_start_waits_for_the_ports_and_stop_kills_after_the_timeout(tmp_path: Path) -> None:
    collector = LocalCollector(
        tmp_path / "otel", ports=free_otel_ports(), kafka_bootstrap="127.0.0.1:9", binary=_stubborn_binary(tmp_path)
    )
    collector.start(timeout_s=20)
    try:
        pid = collector.pid
        assert pid is not None and collector.status().running
        with pytest.raises(CollectorError, match="already runs"):
            collector.start()
        t0 = time.monotonic()
        assert collector.stop(timeout_s=1.0)
        assert 1.0 <= time.monotonic() - t0 < 8.0, "SIGTERM ignored: killed after the timeout"
        assert collector.pid is None and not collector.pid_file.exists()
    finally:
        collector.stop(timeout_s=1.0)


def test_a_taken_port_is_refused_before_launch(tmp_path: Path) -> None:
    ports = free_otel_ports()
    collector = LocalCollector(
        tmp_path / "otel", ports=ports, kafka_bootstrap="127.0.0.1:9", binary=_stubborn_binary(tmp_path)
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.prometheus_port))
        taken.listen()
        with pytest.raises(CollectorError, match=f"prometheus_port 127.0.0.1:{ports.prometheus_port} is in use"):
            collector.start()
    assert not collector.pid_file.exists()


def test_an_early_exit_reports_the_log(tmp_path: Path) -> None:
    binary = tmp_path / "otelcol-broken"
    binary.write_text(f"#!{sys.executable}\nimport sys\nprint('error decoding config')\nsys.exit(3)\n")
    binary.chmod(0o755)
    collector = LocalCollector(tmp_path / "otel", ports=free_otel_ports(), kafka_bootstrap="127.0.0.1:9", binary=binary)
    with pytest.raises(CollectorError, match=r"exited with code 3 during start-up[\s\S]*error decoding config"):
        collector.start(timeout_s=20)
