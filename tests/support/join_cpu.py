"""Issue 27's CPU criterion on the real broker: the join's CPU per message over the isolation test's inputs
(:mod:`tests.support.isolation_traffic`), one join at a time.

Each run's whole input is produced once, as a backlog, to topics of its own; each pass is a fresh
``ttft worker --role join`` with its own ``app_id`` (consumer groups and changelogs from nothing, no state to
restore) through that backlog from the start. Its CPU seconds (user + system, from ``/proc``) are taken
from the first event it consumed until it had consumed every message; divided by the messages, that is its
CPU per message. One join at a time, on a broker with nothing else to do: the live isolation test runs its
pipelines side by side with a paced producer, and there the share of the two cores each join gets moves its
CPU per event by more than the criterion's 20 % from run to run.

Used by ``tests/integration/test_join_cpu_isolation.py`` (which asserts issue 27's 20 %) and by
``python -m bench --only isolation_broker`` (which reports every reading).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from streams.kafka.topics import ensure_topics
from streams.ports import free_port
from streams.settings import Settings, load_settings
from tests.support import hostile_mix
from tests.support.hostile_mix import Placed
from tests.support.isolation_traffic import LIVE_TAIL_S, IsolationInputs, config_27, isolation_inputs
from tests.support.pipeline import Pipeline, WorkerProcess, pipeline_env
from tests.support.scenarios import write_config

#: The inputs a run may be given (see :class:`tests.support.isolation_traffic.IsolationInputs`): the good
#: tenants alone; with issue 14's hostile tenant (the isolation test before issue 27); with that and issue 27's
#: attacks (``mixed``, the isolation test now); the good tenants with issue 27's attacks only; everything
#: ``mixed`` has that ``alone`` has not (``hostile``: what the two parts of ``mixed`` cost apart).
RUNS: dict[str, Callable[[IsolationInputs], list[Placed]]] = {
    "alone": lambda i: i.good,
    "issue14": lambda i: i.issue14,
    "mixed": lambda i: i.mixed,
    "attacks": lambda i: i.good + i.attacks,
    "hostile": lambda i: i.hostile(),
}


@dataclass(frozen=True)
class JoinCpu:
    """One join's pass over one run's backlog."""

    run: str
    messages: int
    cpu_s: float
    wall_s: float

    @property
    def us_per_message(self) -> float:
        return self.cpu_s / self.messages * 1e6


def backlog_inputs() -> IsolationInputs:
    """The isolation inputs with every message already due: the live tail is part of the backlog."""
    return isolation_inputs(time.time() * 1000.0 - LIVE_TAIL_S * 1000.0 - 5_000.0)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Backlog:
    """One run's input, produced once to its own topics (``prefix``): every pass reads it from the start."""

    run: str
    bootstrap: str
    prefix: str
    config: Path
    messages: int


def produce_backlog(bootstrap: str, root: Path, run: str, messages: Sequence[Placed]) -> Backlog:
    """Produce ``messages`` to fresh topics (prefix ``c<hex>``) and write the runs' configuration."""
    prefix = f"c{uuid.uuid4().hex[:8]}"
    home = root / f"{run}-{prefix}"
    home.mkdir(parents=True)
    settings = load_settings(kafka_bootstrap=bootstrap, home=home, topic_prefix=prefix, app_id=prefix)
    otlp = f"{prefix}-otlp_spans"
    asyncio.run(ensure_topics(settings))
    asyncio.run(create_topic(settings, otlp))
    config = write_config(home / "ttft.yaml", config_27(prefix))
    topics = {"stage-events": settings.topic("stage-events"), "otlp": otlp}
    producer = hostile_mix.PacedProducer(bootstrap, {run: (topics, list(messages))})
    producer.send_backlog()
    total = producer.backlog[run]
    assert total == len(messages), f"{len(messages) - total} messages of the {run} run were not due"
    return Backlog(run, bootstrap, prefix, config, total)


def measure_join(backlog: Backlog, root: Path, timeout_s: float = 300.0) -> JoinCpu:
    """Time a fresh join (its own ``app_id``: consumer groups and changelogs from nothing) through ``backlog``."""
    app_id = f"{backlog.prefix}-{uuid.uuid4().hex[:6]}"
    home = root / app_id
    home.mkdir(parents=True)
    settings = load_settings(kafka_bootstrap=backlog.bootstrap, home=home, topic_prefix=backlog.prefix, app_id=app_id)
    total = backlog.messages
    pipe = Pipeline(pipeline_env(settings, home, TTFT_CONFIG=str(backlog.config), TTFT_APP_ID=app_id), home)
    join = pipe.start("join", free_port())
    try:
        _wait(join, lambda: join.metric("ttft_events_consumed_total") > 0, 120.0, "its first event", 0.02)
        cpu0, wall0 = proc_cpu_s(join.proc.pid), time.monotonic()
        # Polled each second: a scrape of /metrics costs the join 2-5 ms of CPU (more series in the mixed run).
        _wait(join, lambda: _consumed(join) >= total, timeout_s, f"all {total} messages", 1.0)
        return JoinCpu(backlog.run, total, proc_cpu_s(join.proc.pid) - cpu0, time.monotonic() - wall0)
    finally:
        pipe.stop_all()


def _consumed(join: WorkerProcess) -> float:
    """Messages the join consumed: stage events (decodable or not) and OTLP messages."""
    metrics = join.metrics()
    return sum(
        v
        for k, v in metrics.items()
        if k.startswith(("ttft_events_consumed_total", "ttft_otlp_messages_total")) and not k.endswith("_created")
    )


def _wait(join: WorkerProcess, done: Callable[[], bool], timeout_s: float, what: str, every_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not join.alive():
            raise AssertionError(f"the join exited before {what}: {join.log()[-3000:]}")
        try:
            if done():
                return
        except OSError:  # /metrics slow to answer on a busy host
            pass
        time.sleep(every_s)
    raise AssertionError(f"the join did not consume {what} within {timeout_s:.0f} s")


def produce_runs(bootstrap: str, root: Path, runs: Sequence[str]) -> list[Backlog]:
    """Each of ``runs`` (names in :data:`RUNS`) produced once, as a backlog of its own."""
    inputs = backlog_inputs()
    return [produce_backlog(bootstrap, root, run, RUNS[run](inputs)) for run in runs]


def measure_passes(backlogs: Sequence[Backlog], root: Path, rounds: int) -> dict[str, list[JoinCpu]]:
    """``rounds`` passes through each backlog, interleaved (run 1, run 2, ..., run 1, run 2, ...): a noisy
    neighbour slows the runs alike."""
    out: dict[str, list[JoinCpu]] = {backlog.run: [] for backlog in backlogs}
    for _ in range(rounds):
        for backlog in backlogs:
            out[backlog.run].append(measure_join(backlog, root))
    return out


def measure_runs(bootstrap: str, root: Path, runs: Sequence[str], rounds: int = 2) -> dict[str, list[JoinCpu]]:
    """Each of ``runs`` produced once, then ``rounds`` passes of each, interleaved."""
    return measure_passes(produce_runs(bootstrap, root, runs), root, rounds)


def best(passes: Sequence[JoinCpu]) -> JoinCpu:
    """The pass with the least CPU per message (the others had more of the host's noise)."""
    return min(passes, key=lambda p: p.us_per_message)


def paired_ratio(runs: Sequence[JoinCpu], baselines: Sequence[JoinCpu]) -> float:
    """The median over rounds of a run's CPU per message over its baseline's in the same round: the two
    passes of a round are minutes apart at most, where the best passes of each may come from a quiet minute
    for one and a busy one for the other."""
    return statistics.median(r.us_per_message / b.us_per_message for r, b in zip(runs, baselines, strict=True))


async def create_topic(settings: Settings, topic: str) -> None:
    """Create ``topic`` with the settings' partition count (the OTLP topic of an isolation run)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=settings.partitions, replication_factor=1)])
    finally:
        await admin.close()
