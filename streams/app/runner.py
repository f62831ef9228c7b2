"""Process entry points for ``ttft worker``: the join, the writer, and both; each role a Faust worker.

Each role runs under ``faust.Worker`` with its folds as Faust agents (streams/app/agents.py), serves
``/metrics`` and ``/healthz`` and writes ``$TTFT_HOME/run/<role>-<worker_id>.json`` (pid, metrics port; the
writer adds its embedded store and the URL of the store's read-only HTTP interface) so operators, tests and
the read commands can find it. SIGTERM stops gracefully: the join keeps open requests in its durable
state (they resume after a restart, never finalised early); the writer finishes the batch in flight and
commits it. A stop that cannot finish within ``STOP_DEADLINE_S`` leaves its step uncommitted.
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
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from streams.app.metrics import WorkerMetrics, serve_metrics
from streams.app.partition_fit import fit_partitions
from streams.logs import logging_config
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.app.agents import RoleParts
    from streams.kafka.batches import Outputs

log = logging.getLogger("ttft.worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _write_run_file(
    settings: Settings, role: str, worker_id: str, port: int, extra: dict[str, Any] | None = None
) -> Path:
    """``$TTFT_HOME/run/<role>-<worker_id>.json``, replaced whole (readers never see half a file)."""
    run_dir = settings.home / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{role}-{worker_id}.json"
    info = {"pid": os.getpid(), "role": role, "worker_id": worker_id, "metrics_port": port, **(extra or {})}
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(info))
    partial.replace(path)
    return path


#: The collector's thresholds in every worker: CPython's (700, 10) for the young generations, and a full
#: collection after 100 collections of the middle one instead of 10. A full collection traverses every
#: long-lived object, and a join holds tens of thousands of open requests: in the bench's pipeline phase the
#: default thresholds ran 14 full collections costing 0.54 s of the join's 11.8 s of CPU (0.88 s in the
#: collector in all); with these, one (0.05 s; 0.36 s in all), about 4 % of the join's CPU per event. The
#: state is acyclic (reference counting frees it), so what waits longer is only cyclic garbage.
GC_THRESHOLDS: Final = (700, 10, 100)


def tune_collector() -> None:
    """Move what start-up allocated (modules, pydantic validators, clients) out of the collector's reach, and
    make full collections rarer (:data:`GC_THRESHOLDS`). Frozen objects are still freed by reference
    counting; freezing saved ~2 % of the instructions of a 6,000-event decode + join run under callgrind."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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


def run_join(
    settings: Settings, worker_id: str, metrics_port: int, loglevel: str = "warning", log_format: str = "text"
) -> int:
    """Run a join worker (the join's agent, and the OTLP bridge's with ``otlp.enabled``) until stopped."""
    return _run_role(settings, "join", worker_id, metrics_port, loglevel, log_format)


def run_writer(
    settings: Settings, worker_id: str, metrics_port: int, loglevel: str = "warning", log_format: str = "text"
) -> int:
    """Run the store writer's agent (with the window closer and the rule engine) until stopped."""
    return _run_role(settings, "writer", worker_id, metrics_port, loglevel, log_format)


def _run_role(
    settings: Settings, role: str, worker_id: str, metrics_port: int, loglevel: str, log_format: str = "text"
) -> int:
    """One role under Faust's worker: its agents, then its runners started by a service (streams/app/agents.py).

    ``log_format`` ``json``: Faust's worker gets our JSON handler instead of its coloured one (streams/logs.py).
    """
    import faust

    from streams.app.agents import RoleParts, RoleService, create_role_app

    settings = fit_partitions(settings, role)
    app = create_role_app(settings, role, worker_id)
    metrics = WorkerMetrics(role, worker_id)
    body = _join_parts(app, settings, metrics) if role == "join" else _writer_parts(app, settings, metrics)
    held: dict[str, Any] = {}

    async def start() -> None:
        # mode's worker leaves the root logger at DEBUG: every aiokafka debug call then builds a record the
        # handler drops (about 7 % of the join's CPU in a bench profile).
        logging.getLogger().setLevel(getattr(logging, loglevel.upper(), logging.WARNING))
        from streams.kafka.topics import ensure_topics

        await ensure_topics(settings)
        held["server"], port = await serve_metrics(metrics, metrics_port, host=settings.metrics_host)
        held["run_file"] = _write_run_file(settings, role, worker_id, port)
        log.warning("%s worker %s: metrics on http://%s:%d/metrics", role, worker_id, settings.metrics_host, port)
        await body.start()
        extra = body.run_info()
        if extra:
            held["run_file"] = _write_run_file(settings, role, worker_id, port, extra)
        tune_collector()

    async def cleanup() -> None:
        server = held.pop("server", None)
        if server is not None:
            await server.cleanup()

    parts = RoleParts(start=start, run=body.run, stop=body.stop, close=body.close, cleanup=cleanup)
    app.service(RoleService(app, role, parts))  # type: ignore[arg-type]  # an instance is accepted too
    worker = faust.Worker(
        app,
        loglevel=loglevel,
        quiet=True,
        redirect_stdouts=False,
        logging_config=logging_config(loglevel, log_format) if log_format == "json" else None,
    )
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        run_file = held.get("run_file")
        if isinstance(run_file, Path):
            run_file.unlink(missing_ok=True)
    return 0


def _join_parts(app: Any, settings: Settings, metrics: WorkerMetrics) -> RoleParts:
    """The join's runner and agent, and the OTLP bridge's beside it (``otlp.enabled``)."""
    from streams.app.agents import RoleParts, fold_agent
    from streams.app.join_fold import JoinFold, join_runner_config, join_runner_metrics
    from streams.app.otlp_fold import OtlpFold, otlp_runner_config, otlp_runner_metrics
    from streams.kafka.batches import PartitionBatchRunner

    join = JoinFold(settings, metrics)
    runners = [
        PartitionBatchRunner(
            settings,
            join_runner_config(settings),
            join,
            metrics=join_runner_metrics(metrics),
            submit=fold_agent(app, "join", join),
            fault_injector=_produce_fault_from_env(
                settings, "TTFT_FAULT_PRODUCE_FAIL_FILE", settings.topic("requests")
            ),
        )
    ]
    if settings.otlp.enabled:  # the Collector's topic feeds ttft.stage-events, in this process
        bridge = OtlpFold(settings, metrics)
        agent = fold_agent(app, "otlp", bridge)
        config, bridge_metrics = otlp_runner_config(settings), otlp_runner_metrics(metrics)
        fault = _produce_fault_from_env(settings, "TTFT_FAULT_OTLP_PRODUCE_FAIL_FILE", settings.topic("stage-events"))
        runners.append(
            PartitionBatchRunner(settings, config, bridge, metrics=bridge_metrics, submit=agent, fault_injector=fault)
        )

    async def start() -> None:
        _report_core_build(metrics)
        for runner in runners:
            await runner.start()

    async def run() -> None:
        await asyncio.gather(*(runner.run() for runner in runners))

    def stop() -> None:
        for runner in runners:
            runner.stop()

    async def close() -> None:
        for runner in runners:
            await runner.close()

    return RoleParts(start=start, run=run, stop=stop, close=close)


def _writer_parts(app: Any, settings: Settings, metrics: WorkerMetrics) -> RoleParts:
    """The store writer's runner and agent, with the window closer, rules and alert delivery as its hooks."""
    from streams.app.agents import RoleParts, fold_agent
    from streams.app.writer import LINGER_MS, StoreWriter
    from streams.app.writer_hooks import install_hooks
    from streams.store.client import chdb_path
    from streams.store.http_interface import serve_embedded_store

    submits: list[Any] = []

    async def submit(step: Any) -> None:
        await submits[0](step)

    writer = StoreWriter(settings, metrics, linger_ms=LINGER_MS, fault_injector=_fault_from_env(), submit=submit)
    submits.append(fold_agent(app, "writer", writer))

    served: dict[str, Any] = {}

    async def start() -> None:
        await writer.start()
        # Readers reach the store this process holds through its HTTP interface; stopped before the store thread.
        interface = await serve_embedded_store(settings, writer.on_store_thread)
        if interface is not None:
            served["url"] = interface.url
            writer.on_stop.append(interface.stop)
        await install_hooks(writer, settings, metrics)

    def stop() -> None:
        writer.runner.stop()

    async def close() -> None:
        await writer.runner.close()

    def run_info() -> dict[str, Any]:
        if urlsplit(settings.store_url).scheme != "chdb":
            return {}
        return {"store_path": chdb_path(settings.store_url), "store_http": served.get("url")}

    return RoleParts(start=start, run=writer.run, stop=stop, close=close, run_info=run_info)


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


def _produce_fault_from_env(settings: Settings, variable: str, topic: str) -> Callable[[Outputs], None] | None:
    """Test hook: ``<variable>=path`` makes a runner's produce of messages to ``topic`` fail while that file
    exists (a produce of heartbeats or state alone still goes through), as a broker refusing them would: the
    step raises and the worker exits uncommitted. ``TTFT_FAULT_PRODUCE_FAIL_FILE``: the join's request
    records; ``TTFT_FAULT_OTLP_PRODUCE_FAIL_FILE``: the OTLP bridge's stage events."""
    path = os.environ.get(variable)
    if not path:
        return None
    from streams.core.watermarks import WATERMARK_KEY

    marker = Path(path)

    def check(outputs: Outputs) -> None:
        if not marker.exists():
            return
        messages = sum(1 for (t, _), items in outputs.items() if t == topic for key, _ in items if key != WATERMARK_KEY)
        if messages:
            raise ConnectionError(f"injected produce failure: {messages} messages to {topic} ({variable})")

    return check


def run_all(
    settings: Settings, worker_id: str, metrics_port: int, loglevel: str = "warning", log_format: str = "text"
) -> int:
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
            "--log-level",
            loglevel,
            "--log-format",
            log_format,
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
