"""Our pipeline end to end: ``ttft worker --role writer`` and ``--role join`` over the pre-produced traffic.

Timed from the first event the join consumed (its ``ttft_events_consumed_total`` leaves 0) until every
request row is in the store; the CPU seconds each worker spent over that span are reported per event.
chDB lets one process hold a store, so "in the store" is read while the writer runs from its
``ttft_records_written_total`` (rows whose insert returned; the clean traffic emits each request once)
and confirmed after the writer stopped with ``SELECT count() FROM requests FINAL``
(:meth:`PipelineSession.verify_store`). The workers stay up for :mod:`bench.lag`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness import BenchEnv, free_port, poll_until, produce
from bench.procstat import MIB, machine_busy_share, read_machine, read_proc
from bench.profiling import flame_svg, inclusive_share, parse_collapsed, start_pyspy, stop_pyspy, top_frames
from bench.traffic import Traffic
from tests.support.pipeline import WorkerProcess


class PipelineSession:
    """One join worker and one writer on their own prefix and store, for the throughput and lag phases."""

    def __init__(self, env: BenchEnv, traffic: Traffic) -> None:
        self.env = env
        self.traffic = traffic
        self.settings = env.settings("pipe")
        env.create_topics(self.settings)
        self.pipe = env.pipeline(self.settings)
        self.join: WorkerProcess | None = None
        self.writer: WorkerProcess | None = None
        self.requests_expected = traffic.requests
        self.peaks: dict[str, int] = {}

    def produce_traffic(self) -> float:
        report = produce(self.settings, self.settings.topic("stage-events"), self.traffic.messages)
        return report.messages_per_s

    def measure_throughput(self, profile_dir: Path | None, timeout_s: float = 300.0) -> dict[str, Any]:
        """Start the writer, then the join on the full topic; events/s until every row is written."""
        self.writer = self.env.start_worker(self.pipe, "writer")
        self.join = self.pipe.start("join", free_port())
        join = self.join
        spies = []
        if profile_dir is not None:
            spies.append((self.writer, start_pyspy(self.writer.proc.pid, profile_dir / "writer-profile.txt")))

        def consumed() -> bool:
            if not join.alive():
                raise RuntimeError(f"join exited: {join.log()[-3000:]}")
            return join.metric("ttft_events_consumed_total") > 0

        first = poll_until(consumed, 120, "the join's first event", interval_s=0.02)
        cpu0 = {w.role: read_proc(w.proc.pid).cpu_s for w in (join, self.writer)}
        machine0 = read_machine()
        if profile_dir is not None:
            spies.append((join, start_pyspy(join.proc.pid, profile_dir / "join-profile.txt")))
        writer = self.writer
        consumed_all: list[float] = []

        def written() -> bool:
            self._sample_peaks()
            if not consumed_all and join.metric("ttft_events_consumed_total") >= self.traffic.events:
                consumed_all.append(time.time())
            return writer.metric("ttft_records_written_total") >= self.requests_expected

        done = poll_until(written, timeout_s, "every request row written", interval_s=0.5)
        cpu = {w.role: read_proc(w.proc.pid).cpu_s - cpu0[w.role] for w in (join, writer)}
        busy = machine_busy_share(machine0, read_machine())
        profile: dict[str, Any] = {}
        for worker, spy in spies:
            stop_pyspy(spy)
            profile[worker.role] = _summarise(profile_dir, worker.role)  # type: ignore[arg-type]
        elapsed = done - first
        return {
            "figures": {
                "pipeline_events_per_s": self.traffic.events / elapsed,
                "pipeline_join_cpu_us_per_event": cpu["join"] / self.traffic.events * 1e6,
                "pipeline_writer_cpu_us_per_event": cpu["writer"] / self.traffic.events * 1e6,
                "pipeline_machine_busy": busy,
            },
            "details": {
                "events": self.traffic.events,
                "requests": self.requests_expected,
                "seconds": elapsed,
                # When the join had read every event (polled every 0.5 s): the rest of ``seconds`` is the
                # end of the traffic, whose last requests close once the idle tick has moved event time on
                # by the grace, and the writer's last batch.
                "join_consumed_all_s": (consumed_all[0] - first) if consumed_all else None,
                "join_events_consumed": join.metric("ttft_events_consumed_total"),
                "join_batches": join.metric("ttft_batches_total"),
                "writer_batches": writer.metric("ttft_batches_total"),
                "profile": profile,
            },
        }

    def _sample_peaks(self) -> None:
        for w in (self.join, self.writer):
            if w is not None and w.alive():
                self.peaks[w.role] = max(self.peaks.get(w.role, 0), read_proc(w.proc.pid).peak_rss_bytes)

    def stop(self) -> dict[str, float | None]:
        """Stop both workers (graceful); returns their peak RSS."""
        self._sample_peaks()
        for w in (self.join, self.writer):
            if w is not None:
                self.pipe.stop(w)
        return {
            "rss_peak_join_mb": self.peaks.get("join", 0) / MIB or None,
            "rss_peak_writer_mb": self.peaks.get("writer", 0) / MIB or None,
        }

    def verify_store(self, expected: int) -> dict[str, Any]:
        """After the writer exited: rows in ``requests FINAL`` and the table's bytes on disk per row."""
        sql = (
            "SELECT (SELECT count() FROM {db}.requests FINAL) AS stored, "
            "(SELECT sum(bytes_on_disk) FROM system.parts WHERE database = '{db}' AND table = 'requests' "
            "AND active) AS bytes_on_disk, "
            "(SELECT sum(data_compressed_bytes) FROM system.parts WHERE database = '{db}' "
            "AND table = 'requests' AND active) AS compressed, "
            "(SELECT sum(data_uncompressed_bytes) FROM system.parts WHERE database = '{db}' "
            "AND table = 'requests' AND active) AS uncompressed, "
            "(SELECT sum(rows) FROM system.parts WHERE database = '{db}' AND table = 'requests' "
            "AND active) AS part_rows"
        )
        row = self.pipe.query(sql)[0]
        stored = int(row["stored"])
        if stored != expected:
            raise AssertionError(f"store holds {stored} requests, expected {expected}: a request was lost")
        return {
            "figures": {"ch_bytes_per_request": int(row["bytes_on_disk"]) / stored},
            "details": {k: int(v) for k, v in row.items()},
        }


#: Inclusive shares worth tracking per worker: (label -> regex over the full frame text).
PROFILE_GROUPS: dict[str, dict[str, str]] = {
    "join": {
        "our batch (decode + core + flush)": r"JoinFold\.fold|PartitionBatchRunner\.step",
        "decode_stage_event": r"decode_stage_event",
        "core join (streams/core)": r"streams/core/",
        "produce + await acks (_flush)": r"PartitionBatchRunner\._complete|produce_batches",
        "faust agent / channel": r"faust/streams\.py|faust/channels\.py|faust/agents/",
        "aiokafka producer": r"aiokafka/producer",
        "aiokafka fetcher": r"aiokafka/consumer/fetcher",
        "idle tick": r"JoinAdapter\._tick",
        "restore from the changelog": r"restore_partitions",
        "logging": r"logging/__init__",
        "event loop select": r"EpollSelector\.select",
    },
    "writer": {
        "batch (StoreWriter._process)": r"StoreWriter\._process",
        "insert requests": r"insert_requests",
        "amendments": r"apply_amendments",
        "window closer": r"WindowCloser",
        "re-reading windows from the store": r"fetch_records_between|fetch_window_records",
        "/metrics rendering": r"generate_latest",
        "aiokafka fetcher": r"aiokafka/consumer/fetcher",
        "event loop select": r"EpollSelector\.select",
    },
}


def _summarise(profile_dir: Path, role: str) -> dict[str, Any]:
    """Top frames of one recorded process, and its flame graph next to the stacks."""
    raw = profile_dir / f"{role}-profile.txt"
    if not raw.exists():
        return {"error": (profile_dir / f"{role}-profile.log").read_text(errors="replace")[-500:]}
    stacks = parse_collapsed(raw.read_text(errors="replace"))
    (profile_dir / f"{role}-flame.svg").write_text(flame_svg(stacks, f"{role} worker, pipeline run"))
    tops = top_frames(stacks)
    (profile_dir / f"{role}-top.json").write_text(json.dumps([asdict(t) for t in tops], indent=1))
    shares = {name: round(inclusive_share(stacks, rx), 1) for name, rx in PROFILE_GROUPS[role].items()}
    raw.unlink()  # megabytes of stacks: the flame graph and the summary are what is kept
    (profile_dir / f"{role}-profile.log").unlink(missing_ok=True)
    return {
        "shares_pct": shares,
        "samples": sum(stacks.values()),
        "top_self": [(t.frame, round(t.self_pct, 1), round(t.total_pct, 1)) for t in tops],
    }
