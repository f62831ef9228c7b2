"""Conventions every ``ttft`` command follows: ``--json`` on the commands that report, the version filter's
name, and renamed options that keep working with a warning (log formats: :mod:`streams.logs`).

``--json`` prints exactly one JSON document on stdout (warnings, progress and errors go to stderr), with
times as epoch milliseconds and durations in milliseconds unless a key says otherwise. Which commands
have it, and why the others do not, is :data:`JSON_COMMANDS` / :data:`WITHOUT_JSON` (a test walks the
command tree and holds every command to one of the two).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import click
import orjson

F = TypeVar("F", bound=Callable[..., Any])

#: Commands (as typed after ``ttft``) that report something and print it as JSON with ``--json``.
JSON_COMMANDS: Final = (
    "breakdown",
    "config check",
    "db migrate",
    "grafana build",
    "kafka status",
    "otel check",
    "otel status",
    "report",
    "request",
    "rules status",
    "simulate",
    "top",
    "whatif",
)
#: Commands without ``--json``, and why.
WITHOUT_JSON: Final[dict[str, str]] = {
    "demo": "a story told to people; its numbers are in the report it writes (report.json)",
    "worker": "a long-running process, not a report: --log-format json makes its logs machine-readable",
    "replay": "a long-running job; its result is in the store, read it with breakdown/report --json",
    "kafka up": "an action; `ttft kafka status --json` reports the broker",
    "kafka down": "an action; `ttft kafka status --json` reports the broker",
    "otel up": "an action; `ttft otel status --json` reports the Collector",
    "otel down": "an action; `ttft otel status --json` reports the Collector",
    "otel keys": "an action; it prints the two paths it wrote",
    "otel token": "prints the token alone, for a shell variable or a secret store",
    "grafana push": "an action against a Grafana; its changes are listed one per line",
    "config default": "prints a file (the default config, YAML), not a report",
}


def json_option(help_text: str = "Print the result as JSON on stdout (one document).") -> Callable[[F], F]:
    """The ``--json`` flag, passed as ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def echo_json(payload: Any) -> None:
    """Print ``payload`` as indented JSON on stdout (non-string keys allowed, as the views produce them)."""
    click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def warn(message: str) -> None:
    """A warning on stderr (never mixed into a ``--json`` document)."""
    click.echo(f"warning: {message}", err=True)


# --- the version filter -------------------------------------------------------------------------------


def _old_version_spelling(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        warn("--version is deprecated here (it filters by model version): use --model-version")
    return value


def model_version_option(help_text: str) -> Callable[[F], F]:
    """``--model-version V`` (passed as ``version``), and its former spelling ``--version`` (passed as
    ``old_version``: still accepted, hidden, with a warning); :func:`model_version` merges the two."""

    def decorate(func: F) -> F:
        func = click.option("--version", "old_version", default=None, hidden=True, callback=_old_version_spelling)(func)
        return click.option("--model-version", "version", default=None, metavar="VERSION", help=help_text)(func)

    return decorate


def model_version(version: str | None, old_version: str | None) -> str | None:
    """The version filter given with either spelling; both with different values is a usage error."""
    if version is not None and old_version is not None and version != old_version:
        raise click.UsageError(f"--model-version {version!r} and --version {old_version!r} disagree: give one")
    return version if version is not None else old_version
