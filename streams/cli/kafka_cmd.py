"""``ttft kafka up/down/status``: the local Kafka broker of the default run.

The broker listens on ``TTFT_KAFKA_BOOTSTRAP`` (default ``127.0.0.1:9092``) and keeps its data in
``$TTFT_HOME/kafka``. ``up`` leaves it running in the background (it survives the command) and returns
once it answers metadata requests and the project's topics exist; ``down`` stops it by its recorded PID.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import click

from streams.cli.conventions import echo_json, json_option
from streams.kafka.broker import BrokerError, LocalBroker
from streams.kafka.topics import TopicSetupError, ensure_topics, wait_for_broker
from streams.settings import Settings, load_settings


def _broker(settings: Settings) -> LocalBroker:
    first = settings.kafka_bootstrap.split(",")[0].strip()
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit():
        raise click.ClickException(f"TTFT_KAFKA_BOOTSTRAP must be host:port, got {settings.kafka_bootstrap!r}")
    return LocalBroker(Path(settings.home) / "kafka", host=host or "127.0.0.1", port=int(port), detach=True)


@click.group()
def kafka() -> None:
    """Run the local Apache Kafka broker (KRaft, single node) from the jars of `make kafka-jars`."""


@kafka.command()
@click.option("--timeout", "timeout_s", default=90.0, show_default=True, help="Seconds to wait for readiness.")
def up(timeout_s: float) -> None:
    """Start the broker in the background, wait until it serves requests, create the topics."""
    settings = load_settings()
    broker = _broker(settings)
    state = broker.status()
    if state.running:
        click.echo(f"{state}; already up")
    else:
        t0 = time.monotonic()
        try:
            broker.start(timeout_s=timeout_s)
        except BrokerError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"kafka started in {time.monotonic() - t0:.1f}s (pid {broker.pid}, data {broker.data_dir})")
    try:
        created = asyncio.run(ensure_topics(settings))
    except (TopicSetupError, OSError) as exc:
        raise click.ClickException(f"broker runs, but topic setup failed: {exc}") from exc
    if created:
        click.echo(f"created topics: {', '.join(created)}")
    click.echo(broker.bootstrap)


@kafka.command()
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, help="Seconds before SIGKILL.")
def down(timeout_s: float) -> None:
    """Stop the broker started by `ttft kafka up` (SIGTERM, then SIGKILL after the timeout)."""
    broker = _broker(load_settings())
    if broker.stop(timeout_s=timeout_s):
        click.echo("kafka stopped")
    else:
        click.echo("kafka was not running")


@kafka.command()
@json_option("Print {running, serving, pid, bootstrap, data_dir, problem} as JSON (the exit status is the same).")
def status(as_json: bool) -> None:
    """Exit 0 if the broker runs and answers a metadata request, else exit 1."""
    broker = _broker(load_settings())
    state = broker.status()
    problem = None
    if state.running:
        try:
            asyncio.run(wait_for_broker(broker.bootstrap, timeout_s=5.0))
        except TimeoutError as exc:
            problem = f"kafka process {state.pid} runs but does not serve requests: {exc}"
    serving = state.running and problem is None
    if as_json:
        echo_json(
            {
                "running": state.running,
                "serving": serving,
                "pid": state.pid,
                "bootstrap": broker.bootstrap,
                "data_dir": str(broker.data_dir),
                "problem": problem,
            }
        )
    else:
        click.echo(problem or str(state))
    if not serving:
        raise SystemExit(1)
