"""``ttft demo`` end to end: broker, Alertmanager, workers, the story, the verdict, the report, clean-up.

Everything lives in one demo home (:mod:`streams.demo.home`). Whatever happens (Ctrl-C, SIGTERM, an
exception), :meth:`DemoRun.close` stops the join, the writer, Alertmanager and the broker, in that order;
the children's own process groups, a parent-death signal and an ``atexit`` hook back that up.

The store is read only after the writer has exited: the embedded chDB store admits one process per data
directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from streams.demo.alerting import WebhookRecorder, find_alertmanager, start_alertmanager
from streams.demo.home import (
    DemoError,
    default_home,
    demo_env,
    environment,
    prepare_home,
    settings_for,
    signals_interrupt,
)
from streams.demo.pipeline import (
    REPO_ROOT,
    LagProbe,
    PipelineProgress,
    Worker,
    pipeline_progress,
    start_worker,
    wait_healthy,
)
from streams.demo.plan import DEMO_TENANTS, OTEL_DEMO_TENANTS, OTEL_TENANT, DemoPlan, plan_demo
from streams.demo.processes import ChildProcess, ProcessSet
from streams.demo.summary import DemoResults, collect_results, render_results, story_problems
from streams.demo.view import DemoView, clock, describe_labels
from streams.kafka.broker import LocalBroker, missing_prerequisite
from streams.otel.collector import CollectorError, LocalCollector, default_binary, missing_binary
from streams.ports import free_port
from streams.settings import OtelCollectorConfig, Settings
from streams.store.live import store_holder

__all__ = ["DemoError", "DemoOptions", "DemoRun", "run_demo"]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """``ttft demo`` options. ``duration_s``: wall time of the traffic; ``live``: None = when a TTY;
    ``otel``: tenant :data:`OTEL_TENANT` comes in as OpenTelemetry traces through the Collector."""

    duration_s: float = 180.0
    home: Path | None = None
    seed: int = 7
    alertmanager: bool = True
    live: bool | None = None
    drain_timeout_s: float | None = None
    otel: bool = False

    @property
    def tenants(self) -> tuple[str, ...]:
        return OTEL_DEMO_TENANTS if self.otel else DEMO_TENANTS

    def drain_limit_s(self) -> float:
        """How long the pipeline may take to drain after the producer finished (default: max(300 s, 2x))."""
        return self.drain_timeout_s if self.drain_timeout_s is not None else max(300.0, 2.0 * self.duration_s)


class _Say:
    """Set-up steps: a spinner on a terminal, one line each otherwise."""

    def __init__(self, console: Console, live: bool) -> None:
        self.console = console
        self.live = live
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        self.console.print(f"[{time.monotonic() - self.t0:5.1f}s] {text}", markup=False, highlight=False)

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        if self.live:
            with self.console.status(text):
                yield
        else:
            self(text + " ...")
            yield


def run_demo(options: DemoOptions, console: Console) -> int:
    """Run the whole demo; returns the exit code (0: the story came out as told). Raises ``DemoError``."""
    plan_demo(options.duration_s, time.time() * 1000.0)  # a bad duration fails before anything starts
    problem = missing_prerequisite()
    if problem:
        raise DemoError(f"{problem} (run `make setup`)")
    if options.otel:
        problem = missing_binary(default_binary())
        if problem:
            raise DemoError(f"--otel: {problem}, or run `make demo DEMO_ARGS=--otel`")
    demo = DemoRun(options, console)
    try:
        with signals_interrupt():
            demo.start()
            plan = demo.play()
            results = demo.conclude(plan)
    finally:
        demo.close()
    render_results(console, results)
    problems = story_problems(results)
    for text in problems:
        console.print(f"problem: {text}", markup=False, highlight=False, style="bold red")
    demo.say(f"demo finished; nothing left running. Logs in {demo.home / 'logs'}")
    return 1 if problems else 0


class DemoRun:
    """One demo run: what it started, in the order it started it. :meth:`close` stops all of it."""

    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.live = console.is_terminal if options.live is None else options.live
        self.say = _Say(console, self.live)
        self.home = prepare_home(options.home or default_home())
        self.say(f"demo home {self.home} (wiped and recreated)")
        self.processes = ProcessSet(self.home / "logs")
        self.broker = LocalBroker(self.home / "kafka", port=free_port())
        self.webhook: WebhookRecorder | None = None
        #: No Alertmanager: the writer posts alerts straight to the webhook receiver.
        self.alerts_direct = False
        self.view: DemoView | None = None
        self.env: dict[str, str] = {}
        self.settings: Settings | None = None
        self.workers: dict[str, Worker] = {}
        self.collector: LocalCollector | None = None
        self.generator: ChildProcess | None = None
        #: ``--otel``: the python of the instrumentation libraries' venv.
        self.instrumentation_python: Path | None = None
        #: ``--otel``: the join's ttft_otlp_spans_total by outcome, read before it stops.
        self.otlp_spans: dict[str, float] = {}

    def start(self) -> None:
        """Kafka, Alertmanager (when installed), then the writer and the join worker, healthy."""
        with self.say.step("starting Kafka"):
            started = self.broker.start(timeout_s=120.0)
        self.say(f"kafka ready at {self.broker.bootstrap} in {started:.1f} s")
        binary = find_alertmanager() if self.options.alertmanager else None
        self.webhook = WebhookRecorder(on_alert=self._on_webhook_alert)
        if binary is not None:
            with self.say.step("starting Alertmanager"):
                _, am_url = start_alertmanager(self.processes, self.home / "alertmanager", self.webhook.url, binary)
            self.say(f"alertmanager ready at {am_url} (webhook receiver {self.webhook.url})")
        else:
            # The writer posts to the webhook receiver as it would to Alertmanager: the story still pages.
            am_url = self.webhook.api_url
            self.alerts_direct = True
            why = "not installed (deploy/alertmanager/install.sh)" if self.options.alertmanager else "off"
            self.say(f"alertmanager {why}: alerts go straight to the demo's own webhook receiver {self.webhook.url}")
        self.env = demo_env(self.home, self.broker.bootstrap, am_url)
        self.settings = settings_for(self.env)
        with self.say.step("starting the writer (applies migrations) and the join worker"):
            self.workers["writer"] = start_worker(self.processes, "writer", self.env)
            self.workers["join"] = start_worker(self.processes, "join", self.env)
            wait_healthy(list(self.workers.values()), timeout_s=180.0)
        self._say_store_url()
        if self.options.otel:
            self._start_collector()

    def _say_store_url(self) -> None:
        """Where the live store can be read while the demo runs (the writer's read-only HTTP interface)."""
        assert self.settings is not None
        holder = None
        for _ in range(50):  # the writer names its interface in its run file once the interface listens
            holder = store_holder(self.settings)
            if holder is not None:
                break
            time.sleep(0.2)
        if holder is not None and holder.store_http:
            self.say(f"store open to readers at {holder.store_http} (ClickHouse HTTP, read-only; ttft reads use it)")
        else:
            self.say("the store's HTTP interface is off (see logs/writer.log): ttft reads wait for the end")

    def _start_collector(self) -> None:
        """The Collector on free loopback ports, writing to the broker's OTLP topic (the join created it)."""
        assert self.settings is not None
        ports: set[int] = set()
        while len(ports) < 4:
            ports.add(free_port())
        grpc, http, prometheus, telemetry = sorted(ports)
        self.collector = LocalCollector(
            self.home / "otel",
            ports=OtelCollectorConfig(
                grpc_port=grpc, http_port=http, prometheus_port=prometheus, telemetry_port=telemetry
            ),
            kafka_bootstrap=self.broker.bootstrap,
            env={"TTFT_OTLP__TOPIC": self.settings.otlp.topic, "TTFT_OTLP__ENCODING": self.settings.otlp.encoding},
        )
        self._instrumentation_python()
        with self.say.step("starting the OpenTelemetry Collector"):
            try:
                seconds = self.collector.start(timeout_s=60.0)
            except CollectorError as exc:
                raise DemoError(str(exc)) from None
        self.say(
            f"otel collector ready at {self.collector.grpc_endpoint} (OTLP gRPC) in {seconds:.1f} s: tenant "
            f"{OTEL_TENANT} comes in as traces, through kafka topic {self.settings.otlp.topic}"
        )

    def _instrumentation_python(self) -> None:
        """The venv of the real instrumentation libraries (built once, ~1 min; kept under .cache/)."""
        from streams.otel.instrumentations import instrumentation_python, is_built

        step = "using" if is_built() else "installing (once)"
        with self.say.step(f"{step} the OpenTelemetry instrumentation libraries' venv"):
            try:
                self.instrumentation_python = instrumentation_python()
            except (subprocess.SubprocessError, OSError) as exc:
                raise DemoError(f"--otel: could not install the instrumentation libraries: {exc}") from None
        self.say(f"tenant {OTEL_TENANT}: a RAG service traced by OpenInference's OpenAI instrumentation")

    def _on_webhook_alert(self, alert: dict[str, object]) -> None:
        if self.view is not None:
            self.view.on_webhook_alert(alert)

    def play(self) -> DemoPlan:
        """Produce the story with the live view on, until the pipeline has drained; returns the plan."""
        assert self.settings is not None, "start() first"
        # Planned now, after the set-up: the story ends just before the producer is due to finish.
        now_ms = time.time() * 1000.0
        plan = plan_demo(self.options.duration_s, now_ms, seed=self.options.seed, tenants=self.options.tenants)
        self.say(
            f"workers healthy; playing {plan.expected_requests:,} requests (~{plan.expected_events:,} stage "
            f"events, {len(plan.tenants)} tenants) over {(plan.end_ms - plan.start_ms) / 60_000:.0f} min of "
            f"event time ending {clock(plan.end_ms)} UTC, {plan.speedup:.1f}x faster than real time"
        )
        self.view = DemoView(self.console, plan, self.settings, live=self.live)
        join, writer = self.workers["join"], self.workers["writer"]
        if self.collector is not None:
            self.generator = self._start_generator(plan, now_ms, origin=time.time())
        final = asyncio.run(
            _play(
                plan,
                self.settings,
                self.view,
                join,
                writer,
                self.options.drain_limit_s(),
                self.webhook,
                self.generator,
            )
        )
        self.say(
            f"pipeline drained: {final.records_written:,.0f} requests stored, "
            f"{final.windows_closed:,.0f} windows closed"
        )
        return plan

    def conclude(self, plan: DemoPlan) -> DemoResults:
        """Stop the workers, then read the store (the writer has exited) and write the report."""
        assert self.settings is not None, "start() first"
        if self.collector is not None:
            with contextlib.suppress(OSError):
                self.otlp_spans = self.workers["join"].labelled("ttft_otlp_spans_total", "outcome")
            self.collector.stop()
        with self.say.step("stopping the workers"):
            _stop_workers(self.workers["join"], self.workers["writer"])
        paged = _paged(self.webhook)
        self.close()
        with self.say.step("reading the store and writing the report"):
            from streams.store.client import make_client

            with environment(self.env):
                client = make_client(self.settings)
            results = collect_results(
                client,
                self.settings,
                plan,
                self.home / "report",
                paged,
                time.time() * 1000.0,
                otel_tenant=OTEL_TENANT if self.options.otel else None,
                otlp_spans=self.otlp_spans,
            )
        results.paged_directly = self.alerts_direct
        return results

    def _start_generator(self, plan: DemoPlan, now_ms: float, origin: float) -> ChildProcess:
        """The driver of :data:`OTEL_TENANT`'s instrumented service (:mod:`streams.demo.otel_traffic`)."""
        assert self.collector is not None and self.instrumentation_python is not None
        cmd = [
            sys.executable,
            "-m",
            "streams.demo.otel_traffic",
            "--python",
            str(self.instrumentation_python),
            "--endpoint",
            self.collector.http_endpoint,
            "--duration",
            repr(self.options.duration_s),
            "--now-ms",
            repr(now_ms),
            "--seed",
            str(plan.seed),
            "--tenant",
            OTEL_TENANT,
            "--tenants",
            ",".join(plan.tenants),
            "--origin",
            repr(origin),
        ]
        return self.processes.start("otel-traffic", cmd, env=self.env, cwd=REPO_ROOT)

    def close(self) -> None:
        """Stop everything still running: the Collector, the generator, workers and Alertmanager (newest
        first), the broker, the webhook."""
        if self.collector is not None:
            self.collector.stop()
        self.processes.close()
        self.broker.stop()
        if self.webhook is not None:
            self.webhook.close()
            self.webhook = None


def _paged(webhook: WebhookRecorder | None) -> list[str]:
    """``alertname labels`` of every firing alert delivered to the webhook (by Alertmanager, or directly)."""
    if webhook is None:
        return []
    return sorted(
        {
            f"{(a.get('labels') or {}).get('alertname')} {describe_labels(a.get('labels') or {})}"
            for a in webhook.alerts("firing")
        }
    )


def _stop_workers(join: Worker, writer: Worker) -> None:
    # The join first (it stops producing records), then the writer, which commits what it holds.
    codes = {"join": join.child.stop(timeout_s=60.0), "writer": writer.child.stop(timeout_s=90.0)}
    bad = {role: rc for role, rc in codes.items() if rc != 0}
    if bad:
        logs = "\n".join(f"--- {w.role}\n{w.child.log_tail()}" for w in (join, writer) if w.role in bad)
        raise DemoError(f"worker(s) exited uncleanly {bad}:\n{logs}")


async def _play(
    plan: DemoPlan,
    settings: Settings,
    view: DemoView,
    join: Worker,
    writer: Worker,
    drain_timeout_s: float,
    webhook: WebhookRecorder | None,
    generator: ChildProcess | None = None,
) -> PipelineProgress:
    """Produce the story paced to event time while the view refreshes; then wait for the pipeline to drain.

    With ``generator`` (``--otel``), producing also lasts until it has sent its traces and exited 0.
    """
    from streams.kafka.topics import kafka_client_kwargs
    from streams.sim.produce import Pacer, produce_messages

    otel_tenant = OTEL_TENANT if generator is not None else None
    probe = LagProbe(settings, otlp=generator is not None)
    await probe.start()
    await view.start()
    produce: asyncio.Task[object] | None = None
    progress: PipelineProgress | None = None
    try:
        view.stage = "producing"
        produce = asyncio.create_task(
            produce_messages(
                plan.messages(without=otel_tenant),
                topic=settings.topic("stage-events"),
                client_kwargs=kafka_client_kwargs(settings),
                pacer=Pacer(plan.start_ms, plan.speedup),
                on_progress=view.on_produced,
                progress_every=500,
            )
        )
        while not produce.done() or (generator is not None and generator.alive()):
            progress = await _look(probe, join, writer, progress)
            await view.tick(progress, poll_s=0.8)
        produce.result()
        if generator is not None and generator.proc.returncode != 0:
            raise DemoError(
                f"the OpenTelemetry traffic generator exited with {generator.proc.returncode}:\n{generator.log_tail()}"
            )
        view.stage = "draining"
        deadline = time.monotonic() + drain_timeout_s
        while progress is None or not progress.drained:
            if time.monotonic() > deadline:
                raise DemoError(f"the pipeline did not drain within {drain_timeout_s:.0f} s ({progress})")
            await view.tick(progress, poll_s=0.8)
            progress = await _look(probe, join, writer, progress)
        view.stage = "drained"
        await _await_pages(view, webhook, timeout_s=15.0, progress=progress)
        await view.tick(progress, poll_s=0.5)
        return progress
    finally:
        if produce is not None and not produce.done():
            produce.cancel()
            with contextlib.suppress(BaseException):
                await produce
        await view.stop()
        await probe.stop()


async def _look(
    probe: LagProbe, join: Worker, writer: Worker, last: PipelineProgress | None
) -> PipelineProgress | None:
    for worker in (join, writer):
        if not worker.child.alive():
            raise DemoError(
                f"the {worker.role} worker exited with {worker.child.proc.returncode}:\n{worker.child.log_tail()}"
            )
    try:
        return await pipeline_progress(probe, join, writer)
    except OSError:
        return last


async def _await_pages(
    view: DemoView, webhook: WebhookRecorder | None, timeout_s: float, progress: PipelineProgress
) -> None:
    """Give Alertmanager a few seconds to page every alert that fired (its group_wait is 1 s)."""
    if webhook is None:
        return
    view.stage = "waiting for Alertmanager"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await view.tick(progress, poll_s=0.5)
        firing = {str(m.get("alertname")) for m in view.model.alerts.values() if m.get("state") == "firing"}
        paged = {str((a.get("labels") or {}).get("alertname")) for a in webhook.alerts("firing")}
        if firing <= paged:
            return
