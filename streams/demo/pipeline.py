"""The demo's pipeline: ``ttft worker`` subprocesses, their health and how far behind they are.

"Drained" means what the pipeline tests mean by it: the join has committed every produced event and holds
no open request, the writer has committed every record and dead letter and has no open window, and at
least one window closed. Progress numbers come from the workers' ``/metrics`` and the consumer groups'
committed offsets, never from the store (the writer owns the embedded store while it runs).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.demo.processes import ChildProcess, ProcessSet
from streams.kafka.topics import kafka_client_kwargs
from streams.ports import free_port
from streams.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    """A ``ttft worker --role <role>`` child and the port of its ``/metrics`` and ``/healthz``."""

    role: str
    child: ChildProcess
    port: int

    def metrics(self) -> dict[str, float]:
        """Prometheus samples summed by name (labels dropped)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
        return out

    def labelled(self, name: str, label: str) -> dict[str, float]:
        """The samples of metric ``name`` by the value of ``label`` (other labels summed)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        needle = f'{label}="'
        for line in text.splitlines():
            if not line.startswith(name + "{") or needle not in line:
                continue
            series, _, value = line.rpartition(" ")
            key = series.split(needle, 1)[1].split('"', 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
        return out

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as resp:
                return bool(json.loads(resp.read()).get("status") == "ok")
        except (OSError, ValueError):
            return False


def start_worker(processes: ProcessSet, role: str, env: Mapping[str, str]) -> Worker:
    """Start ``ttft worker --role role`` (this interpreter, the repo as working directory)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "streams.cli.main",
        "worker",
        "--role",
        role,
        "--metrics-port",
        str(port),
        "--worker-id",
        f"demo-{role}",
    ]
    return Worker(role, processes.start(role, cmd, env=env, cwd=REPO_ROOT), port)


def wait_healthy(workers: list[Worker], timeout_s: float) -> None:
    """Block until every worker reports ``status: ok``; raises ``RuntimeError`` (with its log) otherwise."""
    deadline = time.monotonic() + timeout_s
    pending = list(workers)
    while pending:
        for worker in list(pending):
            if not worker.child.alive():
                raise RuntimeError(
                    f"the {worker.role} worker exited with {worker.child.proc.returncode}:\n{worker.child.log_tail()}"
                )
            if worker.healthy():
                pending.remove(worker)
        if pending and time.monotonic() > deadline:
            names = ", ".join(w.role for w in pending)
            raise RuntimeError(f"worker(s) {names} not healthy after {timeout_s:.0f} s:\n{pending[0].child.log_tail()}")
        time.sleep(0.3)


@dataclass(frozen=True, slots=True)
class PipelineProgress:
    """One look at the pipeline."""

    events_consumed: float
    records_written: float
    windows_closed: float
    open_requests: float
    open_windows: float
    join_lag: int
    writer_lag: int
    watermark_ms: float
    #: ``--otel``: the OTLP input's group lag and the traces it still holds (0 without it).
    otlp_lag: int = 0
    otlp_held: float = 0.0

    @property
    def drained(self) -> bool:
        return (
            self.otlp_lag == 0
            and self.otlp_held == 0
            and self.join_lag == 0
            and self.open_requests == 0
            and self.writer_lag == 0
            and self.open_windows == 0
            and self.windows_closed > 0
        )


class LagProbe:
    """Committed-offset lag of the join and writer consumer groups, over one admin and one consumer."""

    def __init__(self, settings: Settings, *, otlp: bool = False) -> None:
        self.settings = settings
        self.otlp = otlp
        kwargs = kafka_client_kwargs(settings)
        self._admin = AIOKafkaAdminClient(**kwargs)
        self._consumer = AIOKafkaConsumer(enable_auto_commit=False, **kwargs)
        self._tps: dict[str, list[TopicPartition]] = {}

    async def start(self) -> None:
        await self._admin.start()
        await self._consumer.start()
        groups = {
            "join": [self.settings.topic("stage-events")],
            "writer": [self.settings.topic("requests"), self.settings.topic("dead-letter")],
        }
        if self.otlp:
            groups["otlp"] = [self.settings.otlp.topic]
        # The admin's metadata, not the consumer's: a consumer without a subscription answers None for
        # partitions_for_topic(), which would make every lag 0.
        described = await self._admin.describe_topics([t for topics in groups.values() for t in topics])
        partitions = {
            str(entry["topic"]): sorted(int(p["partition"]) for p in entry["partitions"])
            for entry in described
            if not entry.get("error_code")
        }
        for role, topics in groups.items():
            missing = [t for t in topics if not partitions.get(t)]
            if missing:
                raise RuntimeError(f"topic(s) {', '.join(missing)} do not exist")
            self._tps[role] = [TopicPartition(t, p) for t in topics for p in partitions[t]]

    @property
    def roles(self) -> list[str]:
        return list(self._tps)

    async def lag(self, role: str) -> int:
        """End offsets minus committed offsets of ``<app_id>-<role>``, summed over its topics."""
        tps = self._tps[role]
        committed = await self._admin.list_consumer_group_offsets(f"{self.settings.app_id}-{role}")
        ends = await self._consumer.end_offsets(tps)
        total = 0
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            total += max(0, ends[tp] - done)
        return total

    async def stop(self) -> None:
        await self._consumer.stop()
        await self._admin.close()


async def pipeline_progress(probe: LagProbe, join: Worker, writer: Worker) -> PipelineProgress:
    """Metrics of both workers and the lag of both groups (raises ``OSError`` if a worker is unreachable)."""
    join_metrics, writer_metrics = await asyncio.gather(
        asyncio.to_thread(join.metrics), asyncio.to_thread(writer.metrics)
    )
    return PipelineProgress(
        events_consumed=join_metrics.get("ttft_events_consumed_total", 0.0),
        records_written=writer_metrics.get("ttft_records_written_total", 0.0),
        windows_closed=writer_metrics.get("ttft_windows_closed_total", 0.0),
        open_requests=join_metrics.get("ttft_open_requests", 0.0),
        open_windows=writer_metrics.get("ttft_open_windows", 0.0),
        join_lag=await probe.lag("join"),
        writer_lag=await probe.lag("writer"),
        watermark_ms=writer_metrics.get("ttft_writer_watermark_ms", 0.0),
        otlp_lag=await probe.lag("otlp") if "otlp" in probe.roles else 0,
        otlp_held=join_metrics.get("ttft_otlp_traces_held", 0.0) if "otlp" in probe.roles else 0.0,
    )
