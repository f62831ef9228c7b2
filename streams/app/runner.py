"""Process entry points for ``ttft worker``: the join (Faust), the writer (aiokafka) and both.

Each process serves ``/metrics`` and ``/healthz`` and writes ``$TTFT_HOME/run/<role>-<worker_id>.json``
(pid, metrics port) so operators and tests can find it. SIGTERM stops gracefully: the join keeps open
requests in its durable state (they resume after a restart, never finalised early); the writer finishes
the batch in flight and commits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.app.metrics import WorkerMetrics, serve_metrics
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.app.batch_join import Outputs

log = logging.getLogger("ttft.worker")

EXIT_INGEST_HALTED = 3


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _write_run_file(settings: Settings, role: str, worker_id: str, port: int) -> Path:
    run_dir = settings.home / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{role}-{worker_id}.json"
    path.write_text(json.dumps({"pid": os.getpid(), "role": role, "worker_id": worker_id, "metrics_port": port}))
    return path


async def _ensure_topics(settings: Settings) -> None:
    from streams.kafka.topics import ensure_topics

    await ensure_topics(settings)


#: A stopping worker that has not finished by then abandons its batch in flight (uncommitted, so replayed).
STOP_DEADLINE_S = 15.0


def run_join(settings: Settings, worker_id: str, metrics_port: int, loglevel: str = "warning") -> int:
    """Run a join worker until stopped: Faust's stream, or our batch consumer (``join.consumer``)."""
    if settings.join.consumer == "batch":
        return asyncio.run(_batch_join_main(settings, worker_id, metrics_port))
    import faust

    from streams.app.join_app import create_join_app

    metrics = WorkerMetrics("join", worker_id)
    worker_dir = settings.home / "workers" / f"join-{worker_id}"
    worker_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(_ensure_topics(settings))
    app = create_join_app(settings, metrics, str(worker_dir))
    state: dict[str, Any] = {}

    @app.task  # type: ignore[untyped-decorator]
    async def _serve() -> None:
        # mode's worker leaves the root logger at DEBUG: every aiokafka/faust debug call then builds a record
        # the handler drops (about 7 % of the join's CPU in the bench profile).
        logging.getLogger().setLevel(getattr(logging, loglevel.upper(), logging.WARNING))
        runner, port = await serve_metrics(metrics, metrics_port, host=settings.metrics_host)
        state["runner"] = runner
        state["run_file"] = _write_run_file(settings, "join", worker_id, port)
        log.warning("join worker %s: metrics on http://%s:%d/metrics", worker_id, settings.metrics_host, port)

    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        run_file = state.get("run_file")
        if isinstance(run_file, Path):
            run_file.unlink(missing_ok=True)
    return 0


def _freeze_startup_objects() -> None:
    """Move what start-up allocated (modules, pydantic validators, clients) out of the collector's reach:
    every full collection would otherwise traverse it again (measured under callgrind: a 6,000-event run of
    decode + join executes ~2% fewer instructions in all; raising the thresholds changed nothing measurable,
    so they stay). Frozen objects are still freed by reference counting."""
    gc.collect()
    gc.freeze()


def _report_core_build(metrics: WorkerMetrics) -> None:
    """Say which build of the join's core runs (streams/core/native.py): a Python fallback costs ~1.5x
    the CPU per event, so it is logged at warning level and shown in ``ttft_join_core_info``."""
    from streams.core import native

    build = "native" if native.STATUS == "native" else "python"
    metrics.join_core.labels(build=build).set(1)
    if build == "native":
        log.info("join core: native (mypyc)")
    else:
        log.warning("join core: %s", native.STATUS)


async def _batch_join_main(settings: Settings, worker_id: str, metrics_port: int) -> int:
    from streams.app.batch_join import BatchJoin
    from streams.app.otlp_bridge import OtlpBridge

    metrics = WorkerMetrics("join", worker_id)
    await _ensure_topics(settings)
    runner, port = await serve_metrics(metrics, metrics_port, host=settings.metrics_host)
    run_file = _write_run_file(settings, "join", worker_id, port)
    log.warning(
        "join worker %s (batch consumer): metrics on http://%s:%d/metrics", worker_id, settings.metrics_host, port
    )
    join = BatchJoin(settings, metrics, fault_injector=_produce_fault_from_env(settings))
    _report_core_build(metrics)
    # The OTLP input feeds ttft.stage-events from the Collector's topic, in this process (streams/app/otlp_bridge.py).
    bridge = OtlpBridge(settings, metrics) if settings.otlp.enabled else None
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopped = asyncio.Event()

    def _on_signal() -> None:
        join.stop()
        if bridge is not None:
            bridge.stop()
        stopped.set()
        # Bounded stop: a batch stuck on a dead broker is cancelled (nothing of it is committed).
        loop.call_later(STOP_DEADLINE_S, lambda: task.cancel() if task is not None else None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal)
    try:
        await join.start()
        if bridge is not None:
            await bridge.start()
        _freeze_startup_objects()
        if bridge is None:
            await join.run()
        else:
            await asyncio.gather(join.run(), bridge.run())
    except asyncio.CancelledError:
        if not stopped.is_set():
            raise
        log.warning("join worker %s: stop deadline passed; the batch in flight was not committed", worker_id)
    finally:
        await runner.cleanup()
        run_file.unlink(missing_ok=True)
    return 0


def run_writer(settings: Settings, worker_id: str, metrics_port: int) -> int:
    """Run the store writer until SIGTERM/SIGINT."""
    return asyncio.run(_writer_main(settings, worker_id, metrics_port))


async def _writer_main(settings: Settings, worker_id: str, metrics_port: int) -> int:
    from streams.app.writer import LINGER_MS, StoreWriter
    from streams.app.writer_hooks import install_hooks

    metrics = WorkerMetrics("writer", worker_id)
    await _ensure_topics(settings)
    runner, port = await serve_metrics(metrics, metrics_port, host=settings.metrics_host)
    run_file = _write_run_file(settings, "writer", worker_id, port)
    log.warning("writer %s: metrics on http://%s:%d/metrics", worker_id, settings.metrics_host, port)
    writer = StoreWriter(settings, metrics, linger_ms=LINGER_MS, fault_injector=_fault_from_env())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(writer.stop()))
    try:
        await writer.start()
        await install_hooks(writer, settings, metrics)
        _freeze_startup_objects()  # as the join does: full collections then skip the start-up heap
        await writer.run()
    finally:
        await runner.cleanup()
        run_file.unlink(missing_ok=True)
    return 0


def _fault_from_env() -> Any:
    """Test hook: ``TTFT_FAULT_STORE_FAIL_FILE=path`` makes inserts fail while that file exists."""
    path = os.environ.get("TTFT_FAULT_STORE_FAIL_FILE")
    if not path:
        return None
    marker = Path(path)

    def check() -> None:
        if marker.exists():
            raise ConnectionError("injected store failure (TTFT_FAULT_STORE_FAIL_FILE)")

    return check


def _produce_fault_from_env(settings: Settings) -> Callable[[Outputs], None] | None:
    """Test hook: ``TTFT_FAULT_PRODUCE_FAIL_FILE=path`` makes the batch join's produce of request records
    fail while that file exists (a produce of heartbeats or state alone still goes through), as a broker
    refusing the records would: the batch raises and the worker exits uncommitted."""
    path = os.environ.get("TTFT_FAULT_PRODUCE_FAIL_FILE")
    if not path:
        return None
    from streams.core.watermarks import WATERMARK_KEY

    marker = Path(path)
    requests_topic = settings.topic("requests")

    def check(outputs: Outputs) -> None:
        if not marker.exists():
            return
        records = sum(
            1
            for (topic, _), items in outputs.items()
            if topic == requests_topic
            for key, _ in items
            if key != WATERMARK_KEY
        )
        if records:
            raise ConnectionError(f"injected produce failure: {records} request records (TTFT_FAULT_PRODUCE_FAIL_FILE)")

    return check


def run_all(settings: Settings, worker_id: str, metrics_port: int) -> int:
    """Run a join worker and the writer as two child processes of this one; stop both together.

    The children die with this process, however it dies (``kill -9`` included): each is started with the
    kernel's parent-death signal set to SIGKILL, so no orphan keeps the broker group or the chDB store
    (a SIGKILLed child acknowledged nothing that is not durable, like any crash). A SIGTERM is forwarded;
    a child still running ``stop_timeout_s`` later (its broker or store gone) is killed, so the worker
    stops in bounded time.
    """
    parent = os.getpid()
    children: list[subprocess.Popen[bytes]] = []
    ports = (metrics_port, metrics_port + 1) if metrics_port else (0, 0)
    for role, port in zip(("writer", "join"), ports, strict=True):
        cmd = [
            sys.executable,
            "-m",
            "streams.cli.main",
            "worker",
            "--role",
            role,
            "--worker-id",
            worker_id,
            "--metrics-port",
            str(port),
        ]
        children.append(subprocess.Popen(cmd, preexec_fn=lambda: _die_with_parent(parent)))
    stopping: list[float] = []

    def forward(signum: int, _frame: Any) -> None:
        if not stopping:
            stopping.append(time.monotonic())
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    rc = 0
    while children:
        for child in list(children):
            code = child.poll()
            if code is None:
                continue
            children.remove(child)
            rc = rc or code
            if code != 0:
                forward(signal.SIGTERM, None)
        if children and stopping and time.monotonic() - stopping[0] > settings.stop_timeout_s:
            log.error("children still running %.0f s after SIGTERM: killing them", settings.stop_timeout_s)
            for child in children:
                child.kill()
        if children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                children[0].wait(timeout=0.5)
    return rc


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In a child, between fork and exec: be SIGKILLed when the parent dies (Linux ``prctl``), and exit
    at once if it died already (the fork raced with its death)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's SIGTERM forwarding still applies
        return
    if os.getppid() != parent:
        os._exit(1)
