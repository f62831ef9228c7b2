"""``ttft worker``: run the pipeline from the environment."""

from __future__ import annotations

import sys

import click

from streams.app.runner import default_worker_id, run_all, run_join, run_writer
from streams.logs import LOG_FORMATS, configure_logging
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
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Logs on stderr for people (text) or one JSON object per line (json: ts, level, logger, message, ...).",
)
def worker(role: str, worker_id: str | None, metrics_port: int | None, log_level: str, log_format: str) -> None:
    """Run the pipeline: join stage events, write records, close windows, evaluate alerts."""
    configure_logging(log_level, log_format)
    try:
        settings = load_settings()
    except ValueError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from exc
    wid = worker_id or default_worker_id()
    port = settings.metrics_port if metrics_port is None else metrics_port
    if role == "join":
        rc = run_join(settings, wid, port, loglevel=log_level, log_format=log_format)
    elif role == "writer":
        rc = run_writer(settings, wid, port, loglevel=log_level, log_format=log_format)
    else:
        rc = run_all(settings, wid, port, loglevel=log_level, log_format=log_format)
    sys.exit(rc)
