"""``ttft worker``: run the pipeline from the environment."""

from __future__ import annotations

import logging
import sys

import click

from streams.app.runner import default_worker_id, run_all, run_join, run_writer
from streams.settings import load_settings


@click.command("worker")
@click.option(
    "--role",
    type=click.Choice(["all", "join", "writer"]),
    default="all",
    show_default=True,
    help="join: the join and OTLP agents (scale out by partitions); writer: the store writer's agent (one per "
    "embedded chDB store); all: both, as two child processes. Each role runs under Faust's worker.",
)
@click.option("--worker-id", default=None, help="Stable id of this worker (default host-pid).")
@click.option("--metrics-port", type=int, default=None, help="Port of /metrics and /healthz (0 = free).")
@click.option("--log-level", default="warning", show_default=True)
def worker(role: str, worker_id: str | None, metrics_port: int | None, log_level: str) -> None:
    """Run the pipeline: join stage events, write records, close windows, evaluate alerts."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = load_settings()
    except ValueError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from exc
    wid = worker_id or default_worker_id()
    port = settings.metrics_port if metrics_port is None else metrics_port
    if role == "join":
        rc = run_join(settings, wid, port, loglevel=log_level)
    elif role == "writer":
        rc = run_writer(settings, wid, port)
    else:
        rc = run_all(settings, wid, port)
    sys.exit(rc)
