"""A real single-node Apache Kafka 4.x broker (KRaft, broker+controller) run from the Maven jars.

``deploy/kafka/fetch-jars.sh`` (``make kafka-jars``) fills ``<repo>/.cache/kafka/libs``; this module writes
``server.properties``, formats the storage with ``kafka.tools.StorageTool`` and runs
``java -cp 'libs/*' kafka.Kafka``. Everything the broker owns lives under one data directory::

    <data_dir>/server.properties   state.json (ports, cluster id)
    <data_dir>/broker.pid          broker.log (stdout+stderr)   log/ (Kafka's log.dirs)

so a second process (``ttft kafka down``) can find and stop a broker started by another one, and a
stopped broker restarts on the same ports and data. Readiness is a metadata request that lists the broker,
not a log line: the data-plane socket only opens once the broker is unfenced, so the first answered
metadata request means the broker serves clients.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from streams.kafka.topics import wait_for_broker
from streams.ports import free_port, port_is_free

log = logging.getLogger(__name__)
_BIND_ATTEMPTS = 3

_REPO_ROOT = Path(__file__).resolve().parents[2]
LIBS_ENV = "TTFT_KAFKA_LIBS"
_PR_SET_PDEATHSIG = 1

LOG4J2_CONFIG = _REPO_ROOT / "deploy" / "kafka" / "log4j2.properties"


class BrokerError(RuntimeError):
    """The broker could not be set up, started or stopped. The message says why (and where the log is)."""


@dataclass(frozen=True)
class BrokerStatus:
    """What :meth:`LocalBroker.status` found: a live process (by recorded PID) and where it listens."""

    running: bool
    pid: int | None
    bootstrap: str

    def __str__(self) -> str:
        if self.running:
            return f"kafka runs at {self.bootstrap} (pid {self.pid})"
        return "kafka is not running"


def default_libs_dir() -> Path:
    """Jar directory: ``$TTFT_KAFKA_LIBS`` or ``<repo>/.cache/kafka/libs``."""
    env = os.environ.get(LIBS_ENV)
    return Path(env) if env else _REPO_ROOT / ".cache" / "kafka" / "libs"


def find_java() -> str | None:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH, else None."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def missing_prerequisite(libs: Path | None = None) -> str | None:
    """Why a broker cannot start here (no java, no jars), or None when it can."""
    if find_java() is None:
        return "java (JDK 17+) is not installed or not on PATH"
    libs = libs or default_libs_dir()
    if not any(libs.glob("kafka_2.13-*.jar")):
        return f"the Kafka jars are missing in {libs}: run `make kafka-jars`"
    return None


def _new_cluster_id() -> str:
    # Kafka's Uuid.randomUuid(): url-safe base64 of 16 random bytes, never starting with '-'.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def pid_alive(pid: int) -> bool:
    """True for a live, non-zombie process (a zombie has exited and only awaits its parent's wait)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def set_parent_death_signal() -> None:
    """``preexec_fn`` of a child: SIGTERM it if the (test) process that started it dies without stopping it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalBroker:
    """One local Kafka broker + KRaft controller in a single JVM, rooted at ``data_dir``.

    Ports: ``port`` (PLAINTEXT clients), ``controller_port`` and, with ``sasl_users``, ``sasl_port``
    (a SASL_PLAINTEXT listener offering PLAIN and SCRAM-SHA-256 for those users; SCRAM credentials are
    written when the storage is first formatted, so users added later only get PLAIN). Unset ports are taken
    from the previous run's ``state.json``, else picked free, and recorded, so :meth:`start` after
    :meth:`stop` reuses the same ports and data.

    ``detach=True`` starts the JVM in its own session and leaves it running after this process exits
    (``ttft kafka up``); otherwise, when started from the main thread, the JVM gets SIGTERM if this process
    dies, so a crashed test run does not leak brokers.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        controller_port: int | None = None,
        sasl_users: Mapping[str, str] | None = None,
        sasl_port: int | None = None,
        libs: Path | None = None,
        heap_mb: int = 512,
        detach: bool = False,
        extra_config: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.libs = (libs or default_libs_dir()).resolve()
        self.heap_mb = heap_mb
        self.detach = detach
        self.sasl_users = dict(sasl_users or {})
        for user, password in self.sasl_users.items():
            # Both end up inside `--add-scram 'SCRAM-SHA-256=[name=U,password=P]'` and a JAAS string.
            if not re.fullmatch(r"[A-Za-z0-9._-]+", user) or not re.fullmatch(r"[^\s,\[\]=\"\\]+", password):
                raise ValueError(f'SASL user {user!r}: use [A-Za-z0-9._-] names and passwords without ,[]=" ')
        self.extra_config = dict(extra_config or {})
        self.jvm_options = tuple(jvm_options)
        state = self._read_state()
        # Ports this object picked itself for a new data dir: another process may bind one between the pick
        # and the JVM's bind, so start() picks them again when the JVM reports "Address already in use".
        self._picked_ports = not state and not port and not (sasl_users and sasl_port)
        self.port: int = port or int(state.get("port", 0)) or free_port(host)
        self.controller_port: int = controller_port or int(state.get("controller_port", 0))
        self.sasl_port: int | None = None
        if self.sasl_users:
            self.sasl_port = sasl_port or int(state.get("sasl_port", 0)) or free_port(host)
        self.cluster_id: str = str(state.get("cluster_id") or _new_cluster_id())
        self._proc: subprocess.Popen[bytes] | None = None

    # --- paths and addresses --------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """PLAINTEXT bootstrap address, ``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """SASL_PLAINTEXT bootstrap address, when the broker was built with ``sasl_users``."""
        return f"{self.host}:{self.sasl_port}" if self.sasl_port else None

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        """PID of the recorded broker process if it is alive, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        # Guard against PID reuse: the process must be a JVM running this data dir's config.
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if b"kafka.Kafka" not in cmdline or str(self._server_properties).encode() not in cmdline:
            return None
        return pid

    @property
    def _server_properties(self) -> Path:
        return self.data_dir / "server.properties"

    # --- lifecycle ------------------------------------------------------------------------------

    def status(self) -> BrokerStatus:
        """Whether the recorded broker process is alive (no network call)."""
        pid = self.pid
        return BrokerStatus(running=pid is not None, pid=pid, bootstrap=self.bootstrap)

    def start(self, timeout_s: float = 90.0) -> float:
        """Write config, format storage if new, start the JVM and block until it serves metadata.

        Returns the seconds from launch to ready. Raises :class:`BrokerError` (with the tail of
        ``broker.log``) when the JVM exits early or is not ready within ``timeout_s``; the JVM is then
        stopped. Blocking: call it from a thread or before the event loop when latency matters.
        """
        if self.pid is not None:
            raise BrokerError(f"a broker already runs from {self.data_dir} (pid {self.pid})")
        problem = missing_prerequisite(self.libs)
        if problem:
            raise BrokerError(problem)
        t0 = time.monotonic()
        for attempt in range(_BIND_ATTEMPTS):
            self._choose_ports()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._write_config()
            self._format_storage()
            self._launch()
            try:
                self._wait_ready(timeout_s)
                return time.monotonic() - t0
            except BrokerError:
                self.stop()
                if not (self._picked_ports and attempt + 1 < _BIND_ATTEMPTS and self._lost_a_port()):
                    raise
                log.warning(
                    "kafka: a port picked for %s was taken before the broker bound it; picking again", self.data_dir
                )
                self.port = free_port(self.host)
                if self.sasl_port:
                    self.sasl_port = free_port(self.host)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM the recorded broker, SIGKILL it after ``timeout_s``. True if a process was stopped."""
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
                self._wait_exit(pid, 10.0)
            stopped = True
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
        self.pid_file.unlink(missing_ok=True)
        return stopped

    def rss_bytes(self) -> int | None:
        """Resident set size of the broker JVM, from /proc (None when it does not run)."""
        pid = self.pid
        if pid is None:
            return None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    # --- internals ------------------------------------------------------------------------------

    def _read_state(self) -> dict[str, int | str]:
        """Ports and cluster id of the previous run (empty for a new data dir or an unreadable file)."""
        try:
            data = json.loads((self.data_dir / "state.json").read_text())
        except (OSError, ValueError):
            data = None
        return {k: v for k, v in data.items() if isinstance(v, int | str)} if isinstance(data, dict) else {}

    def _choose_ports(self) -> None:
        # A recorded controller port may have been taken since; the static voter set only names the node
        # id, so moving the controller to another port keeps the data usable.
        if not self.controller_port or not port_is_free(self.host, self.controller_port):
            self.controller_port = free_port(self.host)
        if not port_is_free(self.host, self.port):
            raise BrokerError(f"port {self.bootstrap} is in use by another process")
        if self.sasl_port and not port_is_free(self.host, self.sasl_port):
            raise BrokerError(f"SASL port {self.sasl_bootstrap} is in use by another process")
        state: dict[str, int | str] = {
            "port": self.port,
            "controller_port": self.controller_port,
            "cluster_id": self.cluster_id,
        }
        if self.sasl_port:
            state["sasl_port"] = self.sasl_port
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    def server_config(self) -> dict[str, str]:
        """The broker's ``server.properties`` as a mapping (single node, explicit topics only)."""
        listeners = [f"PLAINTEXT://{self.bootstrap}"]
        protocol_map = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        if self.sasl_port:
            listeners.append(f"SASL_PLAINTEXT://{self.sasl_bootstrap}")
            protocol_map.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
        config = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": ",".join([*listeners, f"CONTROLLER://{self.host}:{self.controller_port}"]),
            "advertised.listeners": ",".join(listeners),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocol_map),
            "log.dirs": str(self.data_dir / "log"),
            # Topics are created explicitly (streams.kafka.topics); a typo must fail, not create a topic.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            # Internal topics default to replication 3 / min ISR 2, which a single node can never satisfy.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Small machine: fewer threads, and the cleaner's 128 MiB on-heap dedupe buffer shrunk.
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "2",
            "log.cleaner.dedupe.buffer.size": "4194304",
        }
        if self.sasl_users:
            config.update(self._sasl_config())
        config.update(self.extra_config)
        return config

    def _sasl_config(self) -> dict[str, str]:
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
        prefix = "listener.name.sasl_plaintext"
        return {
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            f"{prefix}.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            ),
            # SCRAM credentials live in the cluster metadata; they are added at format time (--add-scram).
            f"{prefix}.scram-sha-256.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
        }

    def _write_config(self) -> None:
        lines = [f"{k}={_properties_escape(v)}" for k, v in self.server_config().items()]
        self._server_properties.write_text("\n".join(lines) + "\n")

    def _java_command(self, main: str, *args: str, heap_mb: int) -> list[str]:
        java = find_java()
        assert java is not None  # checked by missing_prerequisite
        return [
            java,
            "-Xms64m",
            f"-Xmx{heap_mb}m",
            # Serial GC: smallest footprint and fastest start on 2 shared cores; the broker is not GC-bound.
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            f"{self.libs}/*",  # expanded by the JVM, not a shell
            main,
            *args,
        ]

    def _format_storage(self) -> None:
        if (self.data_dir / "log" / "meta.properties").is_file():
            return  # formatted by an earlier start; skipping saves a JVM launch (~1.5 s) per restart
        args = ["format", "-t", self.cluster_id, "-c", str(self._server_properties), "--ignore-formatted"]
        for user, password in self.sasl_users.items():
            args += ["--add-scram", f"SCRAM-SHA-256=[name={user},password={password}]"]
        cmd = self._java_command("kafka.tools.StorageTool", *args, heap_mb=256)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=_environment())
        if result.returncode != 0:
            raise BrokerError(
                f"kafka storage format failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
            )

    def _launch(self) -> None:
        cmd = self._java_command("kafka.Kafka", str(self._server_properties), heap_mb=self.heap_mb)
        # The parent-death signal fires when the *thread* that forked exits, so only tie the broker to
        # the main thread; a broker started from a worker thread must be stopped explicitly.
        tie = not self.detach and threading.current_thread() is threading.main_thread()
        preexec: Callable[[], None] | None = set_parent_death_signal if tie else None
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # a Ctrl-C in the terminal must not kill the broker mid-write
                preexec_fn=preexec,
                env=_environment(),
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        proc = self._proc
        assert proc is not None
        while True:
            if proc.poll() is not None:
                raise BrokerError(f"kafka exited with code {proc.returncode} during start-up\n{self._log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(f"kafka did not serve metadata within {timeout_s:.0f}s\n{self._log_tail()}")
            if _probe(self.bootstrap, min(remaining, 5.0)):
                return
            time.sleep(0.2)

    def _lost_a_port(self) -> bool:
        """The last start-up failed because a listener's port was bound by someone else."""
        return "java.net.BindException: Address already in use" in self._log_tail()

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


def _probe(bootstrap: str, timeout_s: float) -> bool:
    """One metadata round trip, in a private event loop on a worker thread (safe inside a running loop)."""
    outcome: list[bool] = [False]

    def run() -> None:
        try:
            asyncio.run(wait_for_broker(bootstrap, timeout_s, attempts=1))
            outcome[0] = True
        except Exception:  # any failure only means "not ready yet"
            outcome[0] = False

    worker = threading.Thread(target=run, name="kafka-probe", daemon=True)
    worker.start()
    worker.join(timeout_s + 5.0)
    return outcome[0]


def _properties_escape(value: str) -> str:
    # java.util.Properties treats backslash as an escape; newlines would end the entry.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _environment() -> dict[str, str]:
    """A copy of this process's environment for a child, taken under the GIL.

    Without ``env=``, the child's ``execve`` reads the C ``environ`` array. A broker started from a worker
    thread (the fault lab starts several at once) is forked while another thread may ``setenv``, which can
    move that array: the exec then fails with ``OSError: [Errno 14] Bad address`` (seen in CI).
    """
    return dict(os.environ)
