"""The local OpenTelemetry Collector (``otelcol-ttft``), run as a background process like the Kafka broker.

``make otelcol`` (``deploy/otel/build.sh``) builds ``<repo>/.cache/otel/otelcol-ttft`` from the committed
Builder manifest; this module runs it with the committed ``deploy/otel/collector.yaml``. That config reads
every address from the environment (``TTFT_OTEL__*`` ports, ``TTFT_KAFKA_BOOTSTRAP``), so starting it only
means setting variables. Everything a run owns lives in one directory::

    <data_dir>/collector.pid   collector.log (stdout+stderr)

so ``ttft otel down`` in another process can find and stop a Collector that ``ttft otel up`` left running.
Ready means both OTLP ports accept connections: the Collector starts its exporters and connectors first and
its receivers last, so an open OTLP port means the whole pipeline runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from streams.kafka.broker import pid_alive, set_parent_death_signal
from streams.ports import port_is_free
from streams.settings import OtelCollectorConfig, OtlpConfig

_REPO_ROOT = Path(__file__).resolve().parents[2]
BINARY_ENV = "TTFT_OTELCOL_BIN"
DEFAULT_CONFIG = _REPO_ROOT / "deploy" / "otel" / "collector.yaml"
#: The overlay that sets the tenant with the Collector alone (docs/otlp-mapping.md).
TENANT_OVERLAY = _REPO_ROOT / "deploy" / "otel" / "tenant.yaml"
#: The overlay that takes the tenant from each client's bearer token (docs/otlp-mapping.md, "Authenticated
#: tenants"); it reads the JWKS file from ``TTFT_OTEL__AUTH_KEYS``.
AUTH_OVERLAY = _REPO_ROOT / "deploy" / "otel" / "auth.yaml"
HOST = "127.0.0.1"


class CollectorError(RuntimeError):
    """The Collector could not be started or stopped. The message says why (and where the log is)."""


@dataclass(frozen=True)
class CollectorStatus:
    """What :meth:`LocalCollector.status` found: a live process (by recorded PID) and its OTLP address."""

    running: bool
    pid: int | None
    grpc_endpoint: str

    def __str__(self) -> str:
        if self.running:
            return f"otel collector runs, OTLP gRPC at {self.grpc_endpoint} (pid {self.pid})"
        return "otel collector is not running"


def default_binary() -> Path:
    """The Collector binary: ``$TTFT_OTELCOL_BIN`` or ``<repo>/.cache/otel/otelcol-ttft``."""
    env = os.environ.get(BINARY_ENV)
    return Path(env) if env else _REPO_ROOT / ".cache" / "otel" / "otelcol-ttft"


def missing_binary(binary: Path) -> str | None:
    """Why ``binary`` cannot run (with the command that builds it), or None when it can."""
    if binary.is_file() and os.access(binary, os.X_OK):
        return None
    return (
        f"the OpenTelemetry Collector binary {binary} is missing: run `make otelcol` "
        "(builds it from deploy/otel/builder-config.yaml; ~6 minutes the first time)"
    )


def otlp_env(otlp: OtlpConfig) -> dict[str, str]:
    """The worker's span topic and encoding as the Collector's config reads them (``TTFT_OTLP__*``), so
    producer and consumer agree whichever source (environment, ``TTFT_CONFIG`` YAML) set them."""
    return {"TTFT_OTLP__TOPIC": otlp.topic, "TTFT_OTLP__ENCODING": otlp.encoding}


def _accepts(port: int, timeout_s: float = 0.5) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=timeout_s):
        return True
    return False


class LocalCollector:
    """One ``otelcol-ttft`` process on loopback ports, sending spans to the broker at ``kafka_bootstrap``.

    ``detach=True`` leaves it running after this process exits (``ttft otel up``); otherwise, when started
    from the main thread, it gets SIGTERM if this process dies, so a crashed test run leaks no Collector.
    ``env`` adds variables for the Collector (e.g. ``TTFT_OTLP__TOPIC``); the rest of the environment is
    inherited. ``overlays`` are more config files given after ``config`` (the Collector merges them in order,
    e.g. :data:`TENANT_OVERLAY`).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        ports: OtelCollectorConfig,
        kafka_bootstrap: str,
        binary: Path | None = None,
        config: Path = DEFAULT_CONFIG,
        detach: bool = False,
        env: Mapping[str, str] | None = None,
        overlays: Sequence[Path] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.ports = ports
        self.kafka_bootstrap = kafka_bootstrap
        self.binary = (binary or default_binary()).resolve()
        self.config = config.resolve()
        self.detach = detach
        self.extra_env = dict(env or {})
        self.overlays = tuple(p.resolve() for p in overlays)
        self._proc: subprocess.Popen[bytes] | None = None

    # --- addresses and files --------------------------------------------------------------------

    @property
    def grpc_endpoint(self) -> str:
        """OTLP/gRPC ``host:port`` (an SDK's ``OTEL_EXPORTER_OTLP_ENDPOINT`` is ``http://`` + this)."""
        return f"{HOST}:{self.ports.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """OTLP/HTTP base URL; traces go to ``/v1/traces``."""
        return f"http://{HOST}:{self.ports.http_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus exporter's page: the spanmetrics histograms."""
        return f"http://{HOST}:{self.ports.prometheus_port}/metrics"

    @property
    def telemetry_url(self) -> str:
        """The Collector's own metrics (sent and failed spans per exporter)."""
        return f"http://{HOST}:{self.ports.telemetry_port}/metrics"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "collector.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "collector.log"

    @property
    def pid(self) -> int | None:
        """PID of the recorded Collector if it is alive and runs this binary and config, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        try:  # guard against PID reuse
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if str(self.binary).encode() not in cmdline or str(self.config).encode() not in cmdline:
            return None
        return pid

    def environment(self) -> dict[str, str]:
        """The Collector's environment: this process's, the extra variables, then the addresses it reads."""
        return {
            **os.environ,
            **self.extra_env,
            "TTFT_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "TTFT_OTEL__GRPC_PORT": str(self.ports.grpc_port),
            "TTFT_OTEL__HTTP_PORT": str(self.ports.http_port),
            "TTFT_OTEL__PROMETHEUS_PORT": str(self.ports.prometheus_port),
            "TTFT_OTEL__TELEMETRY_PORT": str(self.ports.telemetry_port),
        }

    # --- lifecycle ------------------------------------------------------------------------------

    def status(self) -> CollectorStatus:
        """Whether the recorded Collector process is alive (no network call)."""
        pid = self.pid
        return CollectorStatus(running=pid is not None, pid=pid, grpc_endpoint=self.grpc_endpoint)

    def start(self, timeout_s: float = 30.0) -> float:
        """Start the Collector and block until both OTLP ports accept connections; returns the seconds taken.

        Raises :class:`CollectorError` when the binary is missing, a port is taken, or the process exits or
        is not ready within ``timeout_s`` (with the tail of ``collector.log``); the process is then stopped.
        """
        if self.pid is not None:
            raise CollectorError(f"a Collector already runs from {self.data_dir} (pid {self.pid})")
        problem = missing_binary(self.binary)
        if problem:
            raise CollectorError(problem)
        for name, port in self.ports.ports().items():
            if not port_is_free(HOST, port):
                raise CollectorError(f"otel {name} {HOST}:{port} is in use by another process")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self._launch()
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def stop(self, timeout_s: float = 10.0) -> bool:
        """SIGTERM the recorded Collector, SIGKILL it after ``timeout_s``. True if a process was stopped."""
        pid = self.pid
        if pid is None and self._proc is not None and self._proc.poll() is None:
            pid = self._proc.pid
        stopped = False
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout_s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_exit(pid, 5.0)
            stopped = True
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
        self.pid_file.unlink(missing_ok=True)
        return stopped

    # --- internals ------------------------------------------------------------------------------

    def _launch(self) -> None:
        # The parent-death signal fires when the *thread* that forked exits: only tie it to the main thread.
        tie = not self.detach and threading.current_thread() is threading.main_thread()
        preexec: Callable[[], None] | None = set_parent_death_signal if tie else None
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.binary), *(a for c in (self.config, *self.overlays) for a in ("--config", str(c)))],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                env=self.environment(),
                start_new_session=True,  # a Ctrl-C in the terminal must not kill it mid-export
                preexec_fn=preexec,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        proc = self._proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                raise CollectorError(f"otelcol exited with code {proc.returncode} during start-up\n{self._log_tail()}")
            if _accepts(self.ports.grpc_port) and _accepts(self.ports.http_port):
                return
            if time.monotonic() > deadline:
                raise CollectorError(f"otelcol opened no OTLP port within {timeout_s:.0f}s\n{self._log_tail()}")
            time.sleep(0.1)

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return True
            elif not pid_alive(pid):
                return True
            time.sleep(0.1)
        return False

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log_file})"
        return f"last lines of {self.log_file}:\n" + "\n".join(text[-lines:])
