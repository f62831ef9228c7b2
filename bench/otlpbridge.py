"""Issue 24: the OTLP bridge's spans/s and CPU per span, beside the Collector's spanmetrics CPU per span.

1. **The Collector, with and without spanmetrics.** The real Collector runs ``deploy/otel/collector.yaml``
   (otlp -> batch -> kafka, plus the two ``span_metrics`` connectors -> prometheus), then a variant written
   to the work directory with the ``span_metrics`` connectors, the prometheus exporter and the metrics
   pipeline removed (:func:`without_spanmetrics`; everything else as committed). The variants alternate
   (with, without, with, without, ...), each a fresh Collector process writing a topic of its own, fed
   ``traces`` traces (3 spans each) by the same OpenTelemetry-SDK service (:mod:`bench.otel_service`, same
   seed). The Collector's CPU is ``utime + stime`` of ``/proc/<pid>/stat``, read 2 s after it is ready
   and again 6 s after its kafka exporter reported every span sent (``otelcol_exporter_sent_spans``,
   polled only once the service exited): 6 s is more than the connectors' 5 s ``metrics_flush_interval``,
   so with spanmetrics the window holds a flush after the last span. Nothing scrapes the prometheus
   exporter inside the window (the connectors' counts are checked after the second reading). The
   connectors' CPU per span is the median CPU/span with them minus the median without. ``/proc`` counts
   clock ticks (10 ms), hence many spans per run: 20,000 traces (60,000 spans) is 0.17 us/span per tick.
2. **The bridge.** The first run's topic (the very spans the spanmetrics connectors counted in that run)
   read to its end by a :class:`streams.kafka.batches.PartitionBatchRunner` running
   :class:`streams.app.otlp_fold.OtlpFold` with the bridge's own
   :func:`~streams.app.otlp_fold.otlp_runner_config` (500 messages per fetch, state and commit with every
   fetch), a fresh consumer group and changelog per read, without Faust (the runner's default submit
   calls the fold), in a subprocess of its own so that none of the bench's threads is in its CPU. It
   decodes, folds, produces the stage events, dead letters and trace state, and commits, as in ``ttft
   worker --role join``. Timed from its first fetch that returned records to the commit that reached the
   end of every partition; the CPU is ``time.process_time()`` of that subprocess over the same interval
   (user + system of the whole process; it runs one thread, the event loop's).
3. **The raw baseline.** The same messages read by a group-less aiokafka consumer with the bridge's fetch
   sizes (``getmany(max_records=500)``), no decode, no commit, in a subprocess of its own, timed and
   measured the same way. At the default size the whole topic (~13 MB) fits in the first fetch response
   of either consumer, so the raw read's wall time is mostly iterating records already fetched; its CPU
   per span is the baseline.

The raw read and the bridge alternate ``reads`` times; the median of each is reported. Every run and
every read is in the details.

Alone: ``python -m bench.otlpbridge --traces 20000`` (starts its own broker); in a full run:
``python -m bench --only otlpbridge``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from streams.settings import OtelCollectorConfig, Settings

REPO = Path(__file__).resolve().parents[1]
SPANS_PER_TRACE = 3
#: Seconds between the Collector's readiness and its first CPU reading (start-up work settles).
IDLE_BEFORE_S = 2.0
#: Seconds after the last span was sent before the second reading: more than the 5 s flush interval.
SETTLE_S = 6.0
_CONNECTOR_TYPES = ("span_metrics", "spanmetrics")
_SENT = re.compile(r'^otelcol_exporter_sent_spans(?:_total)?\{[^}]*exporter="kafka"[^}]*\}\s+(\S+)', re.M)
_FAILED = re.compile(r'^otelcol_exporter_send_failed_spans(?:_total)?\{[^}]*exporter="kafka"[^}]*\}\s+(\S+)', re.M)


# --- pure: the config variant and the figures --------------------------------------------------------


def without_spanmetrics(config: dict[str, Any]) -> dict[str, Any]:
    """The Collector config without its spanmetrics connectors and the prometheus exporter they feed.

    Components are removed from ``connectors``/``exporters`` and from every pipeline's receivers and
    exporters; a pipeline left without receivers or exporters is removed. Everything else is kept."""
    out = copy.deepcopy(config)
    gone: set[str] = set()
    for section, types in (("connectors", _CONNECTOR_TYPES), ("exporters", ("prometheus",))):
        components = out.get(section) or {}
        for name in list(components):
            if name.split("/", 1)[0] in types:
                del components[name]
                gone.add(name)
        if section in out and not components:
            del out[section]
    pipelines = out.get("service", {}).get("pipelines", {})
    for name in list(pipelines):
        pipeline = pipelines[name]
        for key in ("receivers", "exporters"):
            if key in pipeline:
                pipeline[key] = [c for c in pipeline[key] if c not in gone]
        if not pipeline.get("receivers") or not pipeline.get("exporters"):
            del pipelines[name]
    return out


def write_variant(src: Path, dst: Path) -> Path:
    """:func:`without_spanmetrics` of the YAML at ``src``, written to ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(src.read_text())
    dst.write_text(
        f"# {src.name} without the spanmetrics connectors (bench/otlpbridge.py)\n"
        + yaml.safe_dump(without_spanmetrics(config), sort_keys=False)
    )
    return dst


def sent_spans(telemetry: str) -> tuple[float, float]:
    """``(sent, failed)`` spans of the kafka exporter from the Collector's own /metrics page."""

    def total(pattern: re.Pattern[str]) -> float:
        return sum(float(v) for v in pattern.findall(telemetry))

    return total(_SENT), total(_FAILED)


@dataclass(frozen=True)
class CollectorRun:
    """One Collector process fed ``spans`` spans: its CPU seconds between the two readings."""

    variant: str  # "with" or "without" (spanmetrics)
    spans: int
    cpu_s: float
    wall_s: float
    service_s: float
    failed_spans: float = 0.0
    #: With spanmetrics: spans each connector counted, per namespace (a check, read after the CPU).
    counted: dict[str, float] | None = None

    @property
    def cpu_us_per_span(self) -> float:
        return self.cpu_s / self.spans * 1e6 if self.spans else 0.0


@dataclass(frozen=True)
class Read:
    """One timed read of the topic (the bridge's or the raw consumer's), as its subprocess reported it."""

    kind: str  # "bridge" or "raw"
    messages: int
    seconds: float
    cpu_s: float
    extra: dict[str, Any]

    def spans_per_s(self, spans: int) -> float | None:
        return spans / self.seconds if self.seconds > 0 else None

    def cpu_us_per_span(self, spans: int) -> float | None:
        return self.cpu_s / spans * 1e6 if spans else None


def median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def figures_of(runs: list[CollectorRun], reads: list[Read], spans_in_topic: int) -> dict[str, float | None]:
    """The phase's figures: medians over the runs and the reads."""
    cpu = {v: median([r.cpu_us_per_span for r in runs if r.variant == v]) for v in ("with", "without")}
    with_, without = cpu["with"], cpu["without"]
    bridge = [r for r in reads if r.kind == "bridge"]
    raw = [r for r in reads if r.kind == "raw"]

    def med(items: list[Read], fn: str) -> float | None:
        values = [getattr(r, fn)(spans_in_topic) for r in items]
        return median([v for v in values if v is not None])

    return {
        "otlp_bridge_spans": float(spans_in_topic),
        "otlp_bridge_spans_per_s": med(bridge, "spans_per_s"),
        "otlp_bridge_cpu_us_per_span": med(bridge, "cpu_us_per_span"),
        "otlp_bridge_raw_spans_per_s": med(raw, "spans_per_s"),
        "otlp_bridge_raw_cpu_us_per_span": med(raw, "cpu_us_per_span"),
        "otel_collector_cpu_us_per_span_with_spanmetrics": with_,
        "otel_collector_cpu_us_per_span_without_spanmetrics": without,
        "otel_spanmetrics_cpu_us_per_span": None if with_ is None or without is None else with_ - without,
    }


# --- the Collector runs ---------------------------------------------------------------------------


def _free_otel_ports() -> OtelCollectorConfig:
    from bench.spanmetrics import _free_otel_ports as free

    return free()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def collector_run(
    settings: Settings, config: Path, variant: str, data_dir: Path, traces: int, timeout_s: float
) -> CollectorRun:
    """Start a Collector on ``config``, send ``traces`` traces through it, read its CPU around them."""
    from bench.procstat import read_proc
    from bench.spanmetrics import NAMESPACES, parse_histograms
    from streams.otel.collector import LocalCollector, otlp_env

    collector = LocalCollector(
        data_dir,
        ports=_free_otel_ports(),
        kafka_bootstrap=settings.kafka_bootstrap,
        config=config,
        env=otlp_env(settings.otlp),
    )
    collector.start(timeout_s=60.0)
    try:
        pid = collector.pid
        assert pid is not None
        time.sleep(IDLE_BEFORE_S)
        before, w0 = read_proc(pid), time.monotonic()
        cmd = [sys.executable, "-m", "bench.otel_service", "--endpoint", collector.grpc_endpoint]
        cmd += ["--traces", str(traces), "--out", str(data_dir / "truth.json")]
        subprocess.run(cmd, check=True, timeout=timeout_s, cwd=REPO, stdout=subprocess.DEVNULL)
        service_s = time.monotonic() - w0
        want = traces * SPANS_PER_TRACE
        deadline = time.monotonic() + timeout_s
        while True:  # polled only now: a scrape costs the Collector CPU too
            sent, failed = sent_spans(_get(collector.telemetry_url))
            if sent + failed >= want:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Collector sent {sent:.0f} of {want} spans within {timeout_s:.0f} s")
            time.sleep(0.5)
        time.sleep(SETTLE_S)
        after, w1 = read_proc(pid), time.monotonic()
        if failed:
            raise RuntimeError(f"the Collector failed to send {failed:.0f} spans ({variant} spanmetrics)")
        counted = None
        if variant == "with":  # after the reading: did each connector count every span?
            hists = parse_histograms(_get(collector.metrics_url))
            counted = {ns: sum(b[-1][1] for (n, _), b in hists.items() if n == ns and b) for ns in NAMESPACES}
            if min(counted.values()) < want:
                raise RuntimeError(f"the spanmetrics connectors counted {counted} of {want} spans")
        return CollectorRun(variant, int(sent), after.cpu_s - before.cpu_s, w1 - w0, service_s, failed, counted)
    finally:
        collector.stop()


# --- the reads (each in a subprocess of its own) -----------------------------------------------------


def _child_env(settings: Settings, app_id: str, worker_env: dict[str, str]) -> dict[str, str]:
    from tests.support.pipeline import pipeline_env

    return pipeline_env(settings, settings.home, **worker_env, TTFT_APP_ID=app_id, TTFT_OTLP__TOPIC=settings.otlp.topic)


def read_in_subprocess(
    kind: str, settings: Settings, app_id: str, ends: dict[int, int], worker_env: dict[str, str], timeout_s: float
) -> Read:
    """Run ``python -m bench.otlpbridge --child <kind>`` over the topic's first ``ends`` offsets."""
    cmd = [sys.executable, "-m", "bench.otlpbridge", "--child", kind, "--ends", json.dumps(ends)]
    proc = subprocess.run(
        cmd,
        env=_child_env(settings, app_id, worker_env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s + 60.0,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} read exited {proc.returncode}: {proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Read(kind, int(out.pop("messages")), float(out.pop("seconds")), float(out.pop("cpu_s")), out)


async def _bridge(settings: Settings, ends: dict[int, int], timeout_s: float) -> dict[str, Any]:
    """The bridge as ``ttft worker --role join`` runs it, minus Faust; stops at its commit of ``ends``."""
    from aiokafka.structs import OffsetAndMetadata

    from streams.app.metrics import WorkerMetrics
    from streams.app.otlp_fold import OtlpFold, otlp_runner_config, otlp_runner_metrics
    from streams.kafka.batches import PartitionBatchRunner, Step, fold_step

    metrics = WorkerMetrics("join", "bench-otlpbridge")
    fold = OtlpFold(settings, metrics)
    marks: dict[str, tuple[float, float]] = {}
    messages = 0

    async def submit(step: Step) -> None:
        nonlocal messages
        if step.records and "first" not in marks:
            marks["first"] = (time.perf_counter(), time.process_time())
        messages += sum(len(items) for items in step.records.values())
        await fold_step(fold, step)

    runner = PartitionBatchRunner(
        settings, otlp_runner_config(settings), fold, metrics=otlp_runner_metrics(metrics), submit=submit
    )
    await runner.start()
    consumer = runner.consumer
    assert consumer is not None
    commit = consumer.commit
    committed: dict[int, int] = {}
    commits = 0

    async def commit_and_check(offsets: Any = None) -> None:
        nonlocal commits
        await commit(offsets)
        commits += 1
        for tp, offset in (offsets or {}).items():
            committed[tp.partition] = offset.offset if isinstance(offset, OffsetAndMetadata) else int(offset)
        if "last" not in marks and all(committed.get(p, 0) >= end for p, end in ends.items() if end > 0):
            marks["last"] = (time.perf_counter(), time.process_time())
            runner.stop()

    consumer.commit = commit_and_check  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(runner.run(), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"the bridge committed {committed} of {ends} within {timeout_s:.0f} s") from None
    (t0, c0), (t1, c1) = marks["first"], marks["last"]
    counters = fold.core.counters
    return {
        "messages": messages,
        "seconds": t1 - t0,
        "cpu_s": c1 - c0,
        "commits": commits,
        "span_outcomes": dict(counters.spans),
        "held_traces": fold.core.held_traces,
        "held_spans": fold.core.held_spans,
    }


async def _raw(settings: Settings, ends: dict[int, int], timeout_s: float) -> dict[str, Any]:
    """A group-less aiokafka read of the same messages with the bridge's fetch sizes; no decode."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from streams.app.otlp_fold import otlp_runner_config
    from streams.kafka.topics import kafka_client_kwargs

    c = otlp_runner_config(settings)
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False,
        max_partition_fetch_bytes=c.max_partition_fetch_bytes,
        fetch_max_bytes=c.fetch_max_bytes,
        **kafka_client_kwargs(settings),
    )
    await consumer.start()
    try:
        tps = [TopicPartition(settings.otlp.topic, p) for p, end in ends.items() if end > 0]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        total, n, size = sum(ends.values()), 0, 0
        first: tuple[float, float] | None = None
        deadline = time.monotonic() + timeout_s
        while n < total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {n} of {total} messages within {timeout_s:.0f} s")
            batch = await consumer.getmany(timeout_ms=c.poll_ms, max_records=c.batch_max)
            if batch and first is None:
                first = (time.perf_counter(), time.process_time())
            for records in batch.values():
                for record in records:
                    size += len(record.value or b"")
                n += len(records)
        t1, c1 = time.perf_counter(), time.process_time()
        assert first is not None
        return {"messages": n, "seconds": t1 - first[0], "cpu_s": c1 - first[1], "bytes": size}
    finally:
        await consumer.stop()


def _child(kind: str, ends_json: str, timeout_s: float) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING)
    settings = Settings()
    ends = {int(p): int(e) for p, e in json.loads(ends_json).items()}
    fn = _bridge if kind == "bridge" else _raw
    result = asyncio.run(fn(settings, ends, timeout_s))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


async def _end_offsets(settings: Settings) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from bench.harness import topic_partitions
    from streams.kafka.topics import kafka_client_kwargs

    admin = AIOKafkaAdminClient(**kafka_client_kwargs(settings))
    await admin.start()
    try:
        tps = await topic_partitions(admin, settings.otlp.topic)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings))
    await consumer.start()
    try:
        return {tp.partition: int(end) for tp, end in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


# --- the phase ------------------------------------------------------------------------------------


def with_topic(settings: Settings, topic: str) -> Settings:
    """``settings`` with another span topic (the Collector writes it, the bridge reads it)."""
    return settings.model_copy(update={"otlp": settings.otlp.model_copy(update={"topic": topic})})


def measure_otlpbridge(
    settings: Settings,
    workdir: Path,
    traces: int = 20_000,
    rounds: int = 2,
    reads: int = 3,
    worker_env: dict[str, str] | None = None,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """The bench phase (module docstring): ``rounds`` Collector runs per variant, each into a topic of its
    own (``<settings.otlp.topic>-with0``, ``-without0``, ...; created here), then ``reads`` reads of the
    first run's topic (the very spans the spanmetrics connectors counted in it) by the raw consumer and by
    the bridge, alternating."""
    from streams.kafka.topics import ensure_named_topics, ensure_topics
    from streams.otel.collector import DEFAULT_CONFIG

    asyncio.run(ensure_topics(settings, ["stage-events", "dead-letter"]))
    workdir.mkdir(parents=True, exist_ok=True)
    configs = {"with": DEFAULT_CONFIG, "without": write_variant(DEFAULT_CONFIG, workdir / "collector-nospan.yaml")}
    runs: list[CollectorRun] = []
    topics: list[str] = []
    for i in range(rounds):
        for variant in ("with", "without"):
            run_settings = with_topic(settings, f"{settings.otlp.topic}-{variant}{i}")
            asyncio.run(ensure_named_topics(run_settings, {run_settings.otlp.topic: {}}))
            run = collector_run(
                run_settings, configs[variant], variant, workdir / f"otel-{variant}{i}", traces, timeout_s
            )
            print(
                f"  collector {variant:7s} spanmetrics, run {i}: {run.cpu_s:.2f} s CPU, "
                f"{run.cpu_us_per_span:.2f} us/span ({run.spans:,} spans, service {run.service_s:.1f} s)",
                file=sys.stderr,
            )
            runs.append(run)
            topics.append(run_settings.otlp.topic)
    bridge_settings = with_topic(settings, topics[0])
    ends = asyncio.run(_end_offsets(bridge_settings))
    spans = runs[0].spans
    done: list[Read] = []
    for i in range(reads):
        for kind in ("raw", "bridge"):
            app_id = f"{settings.app_id}-bridge{i}"
            read = read_in_subprocess(kind, bridge_settings, app_id, ends, worker_env or {}, timeout_s)
            print(
                f"  {kind:6s} read {i}: {read.messages:,} messages in {read.seconds:.2f} s, "
                f"{read.cpu_us_per_span(spans) or 0:.2f} us CPU/span",
                file=sys.stderr,
            )
            done.append(read)
    for read in done:
        if read.messages != sum(ends.values()):
            raise RuntimeError(f"the {read.kind} read took {read.messages} of {sum(ends.values())} messages")
    details: dict[str, Any] = {
        "traces_per_run": traces,
        "bridge_topic": topics[0],
        "bridge_messages": sum(ends.values()),
        "collector_runs": [
            {**asdict(r), "topic": t, "cpu_us_per_span": r.cpu_us_per_span} for r, t in zip(runs, topics, strict=True)
        ],
        "reads": [
            {**asdict(r), "spans_per_s": r.spans_per_s(spans), "cpu_us_per_span": r.cpu_us_per_span(spans)}
            for r in done
        ],
        "collector_config_without": configs["without"].read_text(),
    }
    return {"figures": figures_of(runs, done, spans), "details": details}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.otlpbridge", description=__doc__)
    p.add_argument("--traces", type=int, default=20_000, help="traces per Collector run")
    p.add_argument("--rounds", type=int, default=2, help="Collector runs per variant")
    p.add_argument("--reads", type=int, default=3, help="reads of the topic by the bridge and by the raw consumer")
    p.add_argument("--child", choices=("bridge", "raw"), help=argparse.SUPPRESS)
    p.add_argument("--ends", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a run or read may take")
    args = p.parse_args(argv)
    if args.child:
        return _child(args.child, args.ends, args.timeout)
    from streams.kafka.broker import LocalBroker, missing_prerequisite

    reason = missing_prerequisite()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ttft-otlpbridge-") as tmp:
        root = Path(tmp)
        broker = LocalBroker(root / "broker")
        broker.start()
        try:
            settings = Settings(
                home=root / "home", kafka_bootstrap=broker.bootstrap, topic_prefix="ob", app_id="app-ob"
            )
            settings = with_topic(settings, "ob.otlp_spans")
            t0 = time.monotonic()
            result = measure_otlpbridge(settings, root, args.traces, args.rounds, args.reads, timeout_s=args.timeout)
        finally:
            broker.stop()
    print(json.dumps(result["figures"], indent=2))
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CollectorRun", "Read", "figures_of", "measure_otlpbridge", "sent_spans", "without_spanmetrics"]
