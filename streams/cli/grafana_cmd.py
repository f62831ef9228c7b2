"""``ttft grafana``: dashboards as code (build) and their deployment to a Grafana (push)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import click

from streams.cli.conventions import echo_json, json_option
from streams.grafana.build import (
    DASHBOARDS_DIR,
    IMPORT_DIR,
    RULES_FILE,
    config_settings,
    dashboard_models,
    write_dashboards,
    write_rules,
)
from streams.grafana.push import (
    CLICKHOUSE_PASSWORD_ENV,
    CLICKHOUSE_USER_ENV,
    DEFAULT_FOLDER_TITLE,
    DEFAULT_FOLDER_UID,
    READ_ONLY_USER,
    TIMEOUT_S,
    PushError,
    connect,
    datasource_model,
    push,
    summary,
)
from streams.settings import load_settings

CLICKHOUSE_URL_ENV = "TTFT_GRAFANA_CLICKHOUSE_URL"


@click.group()
def grafana() -> None:
    """Grafana dashboards, data source and optional alert rules (docs/grafana.md)."""


@grafana.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DASHBOARDS_DIR,
    show_default=True,
    help="Directory for the dashboard JSON files.",
)
@click.option(
    "--import-out",
    "import_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=IMPORT_DIR,
    show_default=True,
    help="Directory for the same boards as UI import files (__inputs: Grafana asks for the data source).",
)
@click.option(
    "--rules-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=RULES_FILE,
    show_default=True,
    help="Grafana alert rules file (provisioning, paused).",
)
@json_option("Print {dashboards, rules_file, changed} as JSON.")
def build(out_dir: Path, import_dir: Path, rules_file: Path, as_json: bool) -> None:
    """Regenerate dashboards/*.json, their import files and the Grafana alert rules from TTFT_CONFIG (SLOs,
    thresholds, the trace URL).

    Without TTFT_CONFIG: from deploy/config/ttft.yaml, the config the committed files come from.
    """
    settings = config_settings()
    changed = write_dashboards(settings, out_dir, import_dir)
    if write_rules(settings, rules_file):
        changed.append(rules_file)
    if as_json:
        dashboards = sorted(str(out_dir / name) for name in dashboard_models(settings))
        echo_json({"dashboards": dashboards, "rules_file": str(rules_file), "changed": [str(p) for p in changed]})
        return
    for path in changed:
        click.echo(f"wrote {path}")
    click.echo(f"{len(changed)} file(s) changed" if changed else "up to date")


def _clickhouse_url(option: str | None) -> str:
    if option:
        return option
    from_env = os.environ.get(CLICKHOUSE_URL_ENV)
    if from_env:
        return from_env
    store = load_settings().store_url
    if urlsplit(store).scheme in ("http", "https"):
        parts = urlsplit(store)
        # Never the writer's credentials: only where the server is.
        return f"{parts.scheme}://{parts.hostname}:{parts.port or (8443 if parts.scheme == 'https' else 8123)}"
    raise click.UsageError(
        f"Grafana needs a ClickHouse server, and TTFT_CLICKHOUSE_URL is {store.split(':')[0]}://: pass "
        f"--clickhouse-url http://HOST:8123 or set {CLICKHOUSE_URL_ENV}"
    )


@grafana.command("push")
@click.option("--url", required=True, help="Grafana base URL, e.g. http://localhost:3000 (no credentials).")
@click.option("--folder", default=DEFAULT_FOLDER_TITLE, show_default=True, help="Folder title.")
@click.option("--folder-uid", default=DEFAULT_FOLDER_UID, show_default=True)
@click.option(
    "--clickhouse-url",
    default=None,
    help=f"ClickHouse as Grafana reaches it (default: ${CLICKHOUSE_URL_ENV}, else the store URL).",
)
@click.option("--force", is_flag=True, help="Write every object even when it looks unchanged.")
@click.option("--timeout", type=float, default=TIMEOUT_S, show_default=True, help="Seconds per request.")
def push_cmd(url: str, folder: str, folder_uid: str, clickhouse_url: str | None, force: bool, timeout: float) -> None:
    """Create or update the folder, the ClickHouse data source and the dashboards (idempotent).

    Credentials come from the environment only: TTFT_GRAFANA_TOKEN, or TTFT_GRAFANA_USER and
    TTFT_GRAFANA_PASSWORD. The data source's read-only user and password: TTFT_GRAFANA_CLICKHOUSE_USER
    (default grafana_ro; `default` for a writer's embedded-store interface) and TTFT_GRAFANA_CLICKHOUSE_PASSWORD.
    """
    settings = config_settings()
    password = os.environ.get(CLICKHOUSE_PASSWORD_ENV) or None
    user = os.environ.get(CLICKHOUSE_USER_ENV) or READ_ONLY_USER
    try:
        api = connect(url, os.environ, timeout)
        datasource = datasource_model(_clickhouse_url(clickhouse_url), settings.clickhouse_database, password, user)
        changes = push(
            api,
            datasource=datasource,
            dashboards=dashboard_models(settings),
            folder_uid=folder_uid,
            folder_title=folder,
            force=force,
        )
    except PushError as exc:
        raise click.ClickException(str(exc)) from None
    if password is None:
        click.echo(f"warning: {CLICKHOUSE_PASSWORD_ENV} is not set: the data source has no password", err=True)
    for change in changes:
        click.echo(str(change))
    click.echo(summary(changes))
