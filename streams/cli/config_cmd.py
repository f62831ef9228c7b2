"""``ttft config check FILE``: validate a TTFT_CONFIG file the way a process would at start (for CI).

The file alone is validated (no environment overrides, no other TTFT_CONFIG): the full
:class:`~streams.settings.Settings`, unknown top-level keys, the ``rules`` section as a
:class:`~streams.rules_config.RulesConfig`, and the values that only a deployment can give: a placeholder
``rules.runbook_base_url`` or ``rules.grafana_url`` (an example host, the old repository URL) is refused,
since every alert would lead there. Each problem is printed as ``field.path: message``; any problem exits
with status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from streams.cli.conventions import echo_json, json_option
from streams.resources import default_config_file
from streams.rules.links import RUNBOOK_PATH, placeholder_problem
from streams.rules_config import RulesConfig, rules_config
from streams.settings import Settings, read_config_file


def _paths(exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[str]:
    out = []
    for error in exc.errors():
        path = ".".join(str(p) for p in (*prefix, *error["loc"])) or "(top level)"
        out.append(f"{path}: {error['msg']}")
    return out


def validate_config(data: dict[str, Any]) -> tuple[Settings | None, RulesConfig | None, list[str]]:
    """Validate a parsed config mapping; returns what validated and the problems found."""
    problems = [f"{key}: unknown setting" for key in sorted(set(data) - set(Settings.model_fields))]
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        problems += _paths(exc)
        if not any(str(e["loc"][0]) == "rules" for e in exc.errors() if e["loc"]):
            try:  # report the rules' problems too, not only the first failing section
                RulesConfig.model_validate(data.get("rules") or {})
            except ValidationError as rules_exc:
                problems += _paths(rules_exc, ("rules",))
        return None, None, problems
    try:
        rules = rules_config(settings.rules)
    except ValidationError as exc:
        return settings, None, problems + _paths(exc, ("rules",))
    return settings, rules, problems + link_problems(rules)


def link_problems(rules: RulesConfig) -> list[str]:
    """Placeholders where alerts link to (:func:`streams.rules.links.placeholder_problem`)."""
    out = []
    for field in ("runbook_base_url", "grafana_url"):
        problem = placeholder_problem(getattr(rules, field), f"rules.{field}")
        if problem is not None:
            out.append(f"rules.{field}: {problem}")
    return out


def _spans(settings: Settings, rules: RulesConfig) -> list[str]:
    minutes = settings.windows.window_s / 60.0
    reg = rules.stage_regression
    lines = [
        f"window: {settings.windows.window_s} s",
        f"stage_regression: short {reg.short_windows * minutes:g} min, "
        f"long {reg.long_windows * minutes:g} min, baseline {reg.baseline_windows * minutes:g} min",
        f"canary: span {rules.canary.span_windows * minutes:g} min",
    ]
    for pair in rules.slo_burn.pairs:
        lines.append(
            f"slo_burn: {pair.long_windows * minutes:g} min & {pair.short_windows * minutes:g} min "
            f"at x{pair.burn_rate:g} ({pair.severity})"
        )
    lines.append(
        f"alerts link to: runbook {rules.runbook_base_url or RUNBOOK_PATH + ' (rules.runbook_base_url unset)'}, "
        f"boards {rules.grafana_url or '/d/<uid> paths (rules.grafana_url unset)'}"
    )
    return lines


@click.group(name="config")
def config() -> None:
    """Configuration files (TTFT_CONFIG)."""


@config.command("check")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@json_option("Print {file, ok, problems, spans} as JSON (the exit status is the same).")
def check(file: Path, as_json: bool) -> None:
    """Validate FILE as a TTFT_CONFIG; print OK or each failing field, exit 1 on failure."""
    try:
        data = read_config_file(file)
    except ValueError as exc:
        problems = [str(exc)]
        settings, rules = None, None
    else:
        settings, rules, problems = validate_config(data)
    ok = not problems and settings is not None and rules is not None
    spans = _spans(settings, rules) if settings is not None and rules is not None and ok else []
    if as_json:
        echo_json({"file": str(file), "ok": ok, "problems": problems, "spans": spans})
    elif not ok:
        for line in problems:
            click.echo(f"error: {file}: {line}", err=True)
    else:
        click.echo(f"OK: {file}")
        for line in spans:
            click.echo(f"  {line}")
    if not ok:
        sys.exit(1)


@config.command("default")
def default() -> None:
    """Print the annotated default TTFT_CONFIG (deploy/config/ttft.yaml; a wheel ships it), to start from."""
    click.echo(default_config_file().read_text(encoding="utf-8"), nl=False)
