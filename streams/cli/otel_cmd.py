"""``ttft otel up/down/status``: the local OpenTelemetry Collector, in front of the local broker; ``ttft otel
check``: what recent traces become, per instrumentation scope, and what is missing
(:mod:`streams.cli.otel_check`).

The Collector (``make otelcol``) receives OTLP on ``127.0.0.1`` (ports ``TTFT_OTEL__GRPC_PORT`` 4317 and
``TTFT_OTEL__HTTP_PORT`` 4318), writes spans to Kafka at ``TTFT_KAFKA_BOOTSTRAP`` (topic ``otlp_spans``) and
serves the spanmetrics histograms on ``TTFT_OTEL__PROMETHEUS_PORT`` (8889). ``up`` leaves it running in the
background with its pid and log in ``$TTFT_HOME/otel``; ``down`` stops it by its recorded PID.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from streams.cli.conventions import echo_json, json_option
from streams.cli.otel_check import SpanSourceError, TailStats, read_span_file, read_topic, report_lines
from streams.core.otlp_check import NOT_A_REQUEST, check_traces
from streams.kafka.topics import wait_for_broker
from streams.otel.collector import AUTH_OVERLAY, CollectorError, LocalCollector, missing_binary, otlp_env
from streams.otel.tokens import KEY_FILE, TokenError, TokenKeys, make_keys, mint
from streams.settings import Settings, load_settings


def _collector(settings: Settings) -> LocalCollector:
    """The Collector of these settings: its ports, the broker, and the worker's span topic and encoding (a
    ``TTFT_CONFIG`` YAML ``otlp:`` section reaches the Collector too, not only the environment); with
    ``otel.auth_keys``, the authenticated-tenant overlay (deploy/otel/auth.yaml) reading that JWKS file."""
    env = otlp_env(settings.otlp)
    overlays: tuple[Path, ...] = ()
    if settings.otel.auth_keys:
        env["TTFT_OTEL__AUTH_KEYS"] = str(Path(settings.otel.auth_keys).resolve())
        overlays = (AUTH_OVERLAY,)
    return LocalCollector(
        Path(settings.home) / "otel",
        ports=settings.otel,
        kafka_bootstrap=settings.kafka_bootstrap,
        detach=True,
        env=env,
        overlays=overlays,
    )


def _auth_dir(settings: Settings) -> Path:
    """Where the tenant-token key lives: beside ``otel.auth_keys``, else ``$TTFT_HOME/otel-auth``."""
    if settings.otel.auth_keys:
        return Path(settings.otel.auth_keys).resolve().parent
    return Path(settings.home) / "otel-auth"


@click.group()
def otel() -> None:
    """Run the local OpenTelemetry Collector (built by `make otelcol`) in front of the local broker."""


@otel.command()
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, help="Seconds to wait for readiness.")
def up(timeout_s: float) -> None:
    """Start the Collector in the background, wait until its OTLP ports accept connections."""
    settings = load_settings()
    collector = _collector(settings)
    state = collector.status()
    if state.running:
        click.echo(f"{state}; already up")
        return
    problem = missing_binary(collector.binary)
    if problem:
        raise click.ClickException(problem)
    try:
        asyncio.run(wait_for_broker(settings.kafka_bootstrap, timeout_s=5.0))
    except TimeoutError as exc:
        raise click.ClickException(
            f"kafka does not answer at {settings.kafka_bootstrap} (start it with `ttft kafka up`): {exc}"
        ) from exc
    try:
        seconds = collector.start(timeout_s=timeout_s)
    except CollectorError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"otel collector started in {seconds:.1f}s (pid {collector.pid}, log {collector.log_file})")
    click.echo(f"  OTLP gRPC    {collector.grpc_endpoint}")
    click.echo(f"  OTLP HTTP    {collector.http_endpoint}")
    click.echo(
        f"  spans to     kafka {settings.kafka_bootstrap} topic {settings.otlp.topic} ({settings.otlp.encoding})"
    )
    click.echo(f"  spanmetrics  {collector.metrics_url}")
    click.echo(f"  telemetry    {collector.telemetry_url}")
    if settings.otel.auth_keys:
        click.echo(f"  auth         each client's tenant bearer token (keys {settings.otel.auth_keys})")
        if settings.otlp.tenant_source != "resource":
            click.echo(
                "  warning      otlp.tenant_source is not 'resource': the worker still reads tenant claims on spans"
            )


@otel.command()
@click.option(
    "--dir", "directory", type=click.Path(file_okay=False, path_type=Path), help="Default: $TTFT_HOME/otel-auth."
)
@click.option("--overwrite", is_flag=True, help="Replace an existing key (every token signed with it stops working).")
def keys(directory: Path | None, overwrite: bool) -> None:
    """Make the Ed25519 key that signs the tenants' bearer tokens, and its JWKS file for the Collector."""
    directory = directory or _auth_dir(load_settings())
    try:
        made = make_keys(directory, overwrite=overwrite)
    except TokenError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"private key  {made.key} (keep it secret: it mints any tenant's token)")
    click.echo(f"public keys  {made.jwks}")
    click.echo(
        f"next: TTFT_OTEL__AUTH_KEYS={made.jwks} TTFT_OTLP__TENANT_SOURCE=resource, then `ttft otel token <tenant>`"
    )


@otel.command()
@click.argument("tenant")
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path), help=f"Default: {KEY_FILE} of `ttft otel keys`."
)
@click.option("--days", default=365.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
def token(tenant: str, key: Path | None, days: float) -> None:
    """Print TENANT's bearer token (clients send `Authorization: Bearer <token>`; OTel SDKs:
    OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer <token>")."""
    key = key or TokenKeys.in_dir(_auth_dir(load_settings())).key
    try:
        click.echo(mint(key, tenant, days=days))
    except TokenError as exc:
        raise click.ClickException(str(exc)) from exc


@otel.command()
@click.option("--timeout", "timeout_s", default=10.0, show_default=True, help="Seconds before SIGKILL.")
def down(timeout_s: float) -> None:
    """Stop the Collector started by `ttft otel up` (SIGTERM, then SIGKILL after the timeout)."""
    if _collector(load_settings()).stop(timeout_s=timeout_s):
        click.echo("otel collector stopped")
    else:
        click.echo("otel collector was not running")


@otel.command()
@json_option("Print {running, pid, grpc_endpoint, http_endpoint, binary, missing} as JSON (same exit status).")
def status(as_json: bool) -> None:
    """Exit 0 if the Collector runs, else exit 1."""
    collector = _collector(load_settings())
    state = collector.status()
    if as_json:
        echo_json(
            {
                "running": state.running,
                "pid": state.pid,
                "grpc_endpoint": collector.grpc_endpoint,
                "http_endpoint": collector.http_endpoint,
                "binary": str(collector.binary),
                "missing": missing_binary(collector.binary),
            }
        )
    else:
        click.echo(str(state))
    if not state.running:
        raise SystemExit(1)


@otel.command()
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read an OTLP file (OTLP/JSON lines, or length-prefixed protobuf) instead of the span topic.",
)
@click.option("--traces", default=100, show_default=True, type=click.IntRange(1, 10_000), help="Last N traces.")
@json_option("Print {source, traces, spans, complete, scopes: [...]} as JSON (the exit status is the same).")
def check(path: Path | None, traces: int, as_json: bool) -> None:
    """Map recent traces as the worker would and say, per instrumentation scope, how many become complete
    requests, which attribute or event gave each stage, and what is missing with its fix. Exit 1 when a
    trace is not a complete request (a trace with no stage span, e.g. a health check, is no request)."""
    settings = load_settings()
    tail = TailStats()
    try:
        if path is not None:
            source, spans = str(path), read_span_file(path)
        else:
            source = f"topic {settings.otlp.topic} ({settings.otlp.encoding})"
            spans = read_topic(settings, traces, tail)
    except (SpanSourceError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(f"cannot read {settings.otlp.topic} at {settings.kafka_bootstrap}: {exc}") from exc
    if not spans:
        raise click.ClickException(f"no spans in {source}")
    reports, findings = check_traces(spans, settings.join, settings.caps)
    if as_json:
        echo_json(
            {
                "source": source,
                "traces": len(findings),
                "spans": len(spans),
                "complete": sum(r.complete for r in reports),
                "unkeyed_messages": tail.unkeyed,
                "scopes": [r.to_json() for r in reports],
            }
        )
    else:
        for line in report_lines(source, len(spans), reports, findings):
            click.echo(line)
        if tail.unkeyed:
            click.echo("")
            click.echo(f"keys             {tail.note()}")
    if any(f.status not in ("complete", NOT_A_REQUEST) for f in findings):
        raise SystemExit(1)
