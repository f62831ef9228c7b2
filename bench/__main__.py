"""``python -m bench``: every measurement of issue 7 in one run, on one broker; a JSON file and a table.

Order matters on 2 cores: the simulator speed is measured before the broker starts; the raw baseline
reads the pipeline's topic before the pipeline's workers start; each later phase has the machine to
itself apart from the broker (and whatever else runs on the machine, which the CPU figures show).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.harness import BenchEnv
from bench.results import RESULTS_DIR, RunReport, git_commit, machine_info, render_markdown, render_tables
from bench.traffic import EVENTS_PER_REQUEST, Traffic, build_traffic
from streams.store.shutdown import exit_process

PHASES = (
    "simspeed",
    "raw",
    "pipeline",
    "lag",
    "naive",
    "memory",
    "closeburst",
    "scaleout",
    "quix",
    "spanmetrics",
    "otlpbridge",
    "whatif",
    "isolation",
    "isolation_broker",
)
#: Phases that read the generated traffic; when all are skipped, only a token amount is generated.
TRAFFIC_PHASES = frozenset({"raw", "pipeline", "lag", "naive", "memory", "scaleout"})
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
DOC_START, DOC_END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"

console = Console(stderr=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--events", type=int, default=None, help="stage events of the throughput traffic")
    p.add_argument("--requests", type=int, default=None, help="or: requests of the throughput traffic")
    p.add_argument("--naive-requests", type=int, default=None, help="requests baseline B runs over")
    p.add_argument("--scale-events", type=int, default=600_000, help="events of each scale-out configuration")
    p.add_argument("--scale-rounds", type=int, default=3, help="rounds of 1 then 2 join workers (median reported)")
    p.add_argument("--open-requests", type=int, default=100_000, help="open requests of the memory phase")
    p.add_argument("--close-records", type=int, default=160_000, help="records of the close-burst window")
    p.add_argument("--lag-rate", type=float, default=5_000.0, help="offered events/s of the lag phase")
    p.add_argument("--lag-seconds", type=float, default=30.0, help="length of the lag phase")
    p.add_argument(
        "--lag-high-rate", type=float, default=20_000.0, help="offered events/s of the second lag run (0: none)"
    )
    p.add_argument("--skip", action="append", default=[], help=f"phases to skip, any of {','.join(PHASES)}")
    p.add_argument("--only", action="append", default=[], help="run only these phases (same names as --skip)")
    p.add_argument("--otel-traces", type=int, default=None, help="traces of the spanmetrics phase (3,000)")
    p.add_argument("--bridge-traces", type=int, default=None, help="traces per Collector run of otlpbridge (20,000)")
    p.add_argument("--bridge-rounds", type=int, default=None, help="Collector runs per variant of otlpbridge (2)")
    p.add_argument("--whatif-requests", type=int, default=None, help="stored requests of the whatif phase (1M)")
    p.add_argument("--phase-timeout", type=float, default=600.0, help="seconds a phase may take to drain")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every phase (~2 min)")
    p.add_argument("--profile", action="store_true", help="py-spy the join and writer in the pipeline phase")
    p.add_argument("--update-doc", action="store_true", help=f"write the results table into {DOC.name}")
    p.add_argument("--render", type=Path, default=None, help="only print (and --update-doc) a saved run's JSON")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory of the JSON result")
    p.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="TTFT_KEY=VALUE",
        help="a setting of every worker, e.g. TTFT_JOIN__BATCH_MAX=10000 (recorded in the JSON's args)",
    )
    args = p.parse_args(argv)
    args.skip = {s for item in args.skip for s in item.split(",") if s}
    only = {s for item in args.only for s in item.split(",") if s}
    if only:
        args.skip |= set(PHASES) - only
    unknown = (args.skip | only) - set(PHASES)
    if unknown:
        p.error(f"unknown phase(s) {sorted(unknown)}; known: {', '.join(PHASES)}")
    bad = [item for item in args.worker_env if not item.startswith("TTFT_") or "=" not in item]
    if bad:
        p.error(f"--worker-env takes TTFT_KEY=VALUE, not {bad}")
    if args.events is None:
        args.events = int(args.requests * EVENTS_PER_REQUEST) if args.requests else (40_000 if args.quick else 600_000)
    if not TRAFFIC_PHASES - args.skip:
        args.events = min(args.events, 1_000)
    if args.otel_traces is None:
        args.otel_traces = 1_000 if args.quick else 3_000
    if args.bridge_traces is None:
        args.bridge_traces = 5_000 if args.quick else 20_000
    if args.bridge_rounds is None:
        args.bridge_rounds = 1 if args.quick else 2
    if args.whatif_requests is None:
        args.whatif_requests = 100_000 if args.quick else 1_000_000
    if args.naive_requests is None:
        args.naive_requests = 1_500 if args.quick else 8_000
    if args.quick:
        args.open_requests = min(args.open_requests, 20_000)
        args.close_records = min(args.close_records, 20_000)
        args.lag_high_rate = min(args.lag_high_rate, 5_000.0)
        args.lag_seconds = min(args.lag_seconds, 10.0)
        args.scale_events = min(args.scale_events, 40_000)
        args.scale_rounds = 1
    return args


class Run:
    """Collects figures and details phase by phase; a failing phase is recorded, the run goes on."""

    def __init__(self) -> None:
        self.figures: dict[str, float | None] = {}
        self.details: dict[str, Any] = {}
        self.failed: list[str] = []

    def phase(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        console.rule(f"[bold]{name}")
        started = time.monotonic()
        try:
            result = fn()
        except Exception as exc:  # a broken phase must not hide the others' figures
            console.print(f"[red]{name} failed: {exc!r}")
            self.details[name] = {"error": repr(exc), "traceback": traceback.format_exc()[-4000:]}
            self.failed.append(name)
            return
        if "figures" not in result:
            result = {"figures": result, "details": {}}
        self.figures.update(result["figures"])
        self.details[name] = {**result.get("details", {}), "phase_seconds": time.monotonic() - started}
        shown = ", ".join(f"{k}={v:,.1f}" for k, v in result["figures"].items() if isinstance(v, float | int))
        console.print(f"{name}: {shown} ({time.monotonic() - started:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        return _render_saved(args.render, args.update_doc)
    from streams.kafka.broker import LocalBroker, missing_prerequisite

    reason = missing_prerequisite()
    if reason:
        console.print(f"[red]cannot run the benchmark: {reason}")
        return 2
    started_at = datetime.now(UTC)
    load_start = os.getloadavg()
    wall0 = time.monotonic()
    run = Run()
    if "simspeed" not in args.skip:
        from bench.simspeed import measure_simspeed

        run.phase("simspeed", measure_simspeed)
    if "whatif" not in args.skip:  # no broker: its own store, before the broker takes a core
        from bench.whatif import measure_whatif

        run.phase("whatif", lambda: measure_whatif(args.whatif_requests))
    if "isolation" not in args.skip:  # no broker: the join's fold over the isolation test's inputs
        from bench.isolation import measure_isolation

        run.phase("isolation", lambda: measure_isolation(1 if args.quick else 3))
    root = Path(tempfile.mkdtemp(prefix="ttft-bench-"))
    broker = LocalBroker(root / "broker")
    traffic_box: list[Traffic] = []
    gen = threading.Thread(target=lambda: traffic_box.append(build_traffic(args.events)), daemon=True)
    gen.start()  # the simulator runs while the JVM starts; the broker stays on the main thread (pdeathsig)
    env = BenchEnv(broker, root, worker_env=dict(item.split("=", 1) for item in args.worker_env))
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so workers and the broker are stopped and the
    # figures measured so far are still written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        console.print(f"broker ready in {broker.start():.1f} s; generating {args.events:,} events ...")
        gen.join()
        traffic = traffic_box[0]
        console.print(f"traffic: {traffic.events:,} events, {traffic.requests:,} requests")
        _run_phases(run, args, env, traffic)
        if broker.pid:
            from bench.procstat import MIB, read_proc

            run.figures["rss_peak_broker_mb"] = read_proc(broker.pid).peak_rss_bytes / MIB
    except (KeyboardInterrupt, SystemExit):
        run.failed.append("interrupted")
    finally:
        env.stop_all()
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
        report = _report(run, args, started_at, wall0, load_start)
    path = report.write(args.out)
    out = Console()
    for table in render_tables(report):
        out.print(table)
    console.print(f"results: {path} ({report.meta['wall_s']:.0f} s)")
    if args.update_doc:
        _update_doc(render_markdown(report))
    return 1 if run.failed else 0


def join_core_status(worker_env: dict[str, str]) -> str:
    """The build of the join's core the workers run (:data:`streams.core.native.STATUS` in them):
    ``native`` unless ``--worker-env TTFT_NATIVE=0`` or the compiled modules do not match the tree. The
    workers get no ``TTFT_*`` variable of this process but ``--worker-env`` ones (``pipeline_env``)."""
    from streams.core import native

    if worker_env.get("TTFT_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return "python (TTFT_NATIVE=0)"
    problem = native.check_manifest()
    return "native" if problem is None else f"python ({problem})"


def _report(run: Run, args: argparse.Namespace, started_at: datetime, wall0: float, load: Any) -> RunReport:
    from streams.core import native

    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    join_core = join_core_status(worker_env)
    run.figures["join_core_native"] = 1.0 if join_core == "native" else 0.0
    meta = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "wall_s": time.monotonic() - wall0,
        "args": {
            k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
        },
        "failed_phases": run.failed,
        # Which join core the workers ran (``join_core_native`` in the figures), and this process's.
        "join_core": join_core,
        "join_core_bench_process": native.STATUS,
        # Other work on the machine skews every absolute figure; the ratios and CPU figures less so.
        "loadavg_start": load,
        "loadavg_end": os.getloadavg(),
    }
    return RunReport(run.figures, meta, run.details)


def _run_phases(run: Run, args: argparse.Namespace, env: BenchEnv, traffic: Traffic) -> None:
    from bench.pipeline import PipelineSession

    profile_dir = args.out if args.profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    wants_pipeline = "pipeline" not in args.skip
    session = PipelineSession(env, traffic) if wants_pipeline or "raw" not in args.skip else None
    if session is not None:
        rate = session.produce_traffic()
        console.print(f"pre-produced {traffic.events:,} events at {rate:,.0f} ev/s")
    if "raw" not in args.skip and session is not None:
        from bench.baseline_raw import measure_raw

        topic = session.settings.topic("stage-events")
        run.phase("raw (baseline A)", lambda: measure_raw(env.bootstrap, topic))
    if wants_pipeline and session is not None:
        s = session
        run.phase("pipeline (ours)", lambda: s.measure_throughput(profile_dir, args.phase_timeout))
        if "lag" not in args.skip and "pipeline (ours)" not in run.failed:
            from bench.lag import measure_lag

            run.phase("lag", lambda: measure_lag(s, args.lag_rate, args.lag_seconds))
            if args.lag_high_rate:
                run.phase(
                    "lag (high)",
                    lambda: _renamed(measure_lag(s, args.lag_high_rate, args.lag_seconds), "lag_", "lag_high_"),
                )
        run.phase("pipeline stop", lambda: {"figures": s.stop()})
        run.phase("store check", lambda: s.verify_store(s.requests_expected))
    if "naive" not in args.skip:
        from bench.baseline_faust_naive import measure_naive

        run.phase("naive (baseline B)", lambda: measure_naive(env, traffic, args.naive_requests, args.phase_timeout))
    if "memory" not in args.skip:
        from bench.memory import measure_open_requests

        run.phase("memory", lambda: measure_open_requests(env, traffic, args.open_requests, args.phase_timeout))
    if "closeburst" not in args.skip:
        from bench.closeburst import measure_close_burst

        run.phase("close burst", lambda: measure_close_burst(env, args.close_records, args.phase_timeout))
    if "scaleout" not in args.skip:
        from bench.scaleout import measure_scaleout

        run.phase(
            "scale-out",
            lambda: measure_scaleout(env, traffic, args.scale_events, args.phase_timeout, args.scale_rounds),
        )
    if "quix" not in args.skip:
        from bench.quix import measure_quix

        run.phase("quix", measure_quix)
    if "spanmetrics" not in args.skip:
        from bench.spanmetrics import measure_spanmetrics

        settings = env.settings("spanmetrics")
        settings = settings.model_copy(
            update={"otlp": settings.otlp.model_copy(update={"topic": f"{settings.topic_prefix}.otlp_spans"})}
        )
        run.phase("spanmetrics", lambda: measure_spanmetrics(settings, settings.home, args.otel_traces))
    if "otlpbridge" not in args.skip:
        from bench.otlpbridge import measure_otlpbridge, with_topic

        bridge = env.settings("otlpbridge")
        bridge = with_topic(bridge, f"{bridge.topic_prefix}.otlp_spans")
        run.phase(
            "otlp bridge",
            lambda: measure_otlpbridge(
                bridge,
                bridge.home,
                traces=args.bridge_traces,
                rounds=args.bridge_rounds,
                reads=1 if args.quick else 3,
                worker_env=env.worker_env,
                timeout_s=args.phase_timeout,
            ),
        )
    _isolation_broker(run, args, env)


def _isolation_broker(run: Run, args: argparse.Namespace, env: BenchEnv) -> None:
    if "isolation_broker" not in args.skip:  # issue 27's CPU criterion on the real broker, one join at a time
        from bench.isolation import measure_isolation_broker

        root = env.root / "isolation_broker"
        run.phase("isolation (broker)", lambda: measure_isolation_broker(env.bootstrap, root, 1 if args.quick else 2))


def _renamed(result: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """A phase's figures under other names (a second run of the same phase)."""
    figures = {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in result["figures"].items()}
    return {**result, "figures": figures}


def _render_saved(path: Path, update_doc: bool) -> int:
    data = json.loads(path.read_text())
    report = RunReport(data["figures"], data["meta"], data.get("details", {}))
    out = Console()
    for table in render_tables(report):
        out.print(table)
    if update_doc:
        _update_doc(render_markdown(report))
    return 0


def _update_doc(markdown: str) -> None:
    text = DOC.read_text() if DOC.exists() else ""
    if DOC_START not in text or DOC_END not in text:
        console.print(f"[yellow]{DOC} has no {DOC_START} block; not updated")
        return
    head, rest = text.split(DOC_START, 1)
    _, tail = rest.split(DOC_END, 1)
    DOC.write_text(f"{head}{DOC_START}\n{markdown}{DOC_END}{tail}")
    console.print(f"updated {DOC}")


if __name__ == "__main__":
    exit_process(main())
