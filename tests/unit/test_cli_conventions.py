"""CLI conventions (issue 29): ttft --version, --json on every command that reports (the others say why not),
--model-version with the old --version spelling still working, JSON logs, db migrate's progress. The
commands that need the store or the broker are parsed in tests/integration/test_cli_json.py."""

from __future__ import annotations

import json
import logging
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from streams.cli.conventions import JSON_COMMANDS, WITHOUT_JSON, model_version, model_version_option
from streams.cli.main import COMMANDS, LazyGroup, main
from streams.logs import JsonLogFormatter, logging_config
from streams.store.migrate import MigrationStep, apply_migrations

REPO = Path(__file__).resolve().parents[2]


def leaf_commands() -> dict[str, click.Command]:
    """Every runnable command of the tree, by the words typed after ``ttft``."""
    found: dict[str, click.Command] = {}
    ctx = click.Context(main)

    def walk(prefix: str, command: click.Command) -> None:
        if isinstance(command, click.Group):
            names = command.list_commands(ctx)
            for name in names:
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(f"{prefix} {name}".strip(), sub)
        else:
            found[prefix] = command

    assert isinstance(main, LazyGroup)
    walk("", main)
    return found


def _has_json(command: click.Command) -> bool:
    return any("--json" in getattr(p, "opts", ()) for p in command.params)


def test_every_command_reports_as_json_or_says_why_not() -> None:
    commands = leaf_commands()
    assert {name.split()[0] for name in commands} == set(COMMANDS)
    assert set(JSON_COMMANDS).isdisjoint(WITHOUT_JSON)
    assert set(commands) == set(JSON_COMMANDS) | set(WITHOUT_JSON), "a new command: give it --json or a reason"
    assert sorted(name for name, command in commands.items() if _has_json(command)) == sorted(JSON_COMMANDS)


def test_ttft_version_names_both_distributions_and_python() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == (
        f"ttft {version('ttft-pipeline')} (ttft-emit {version('ttft-emit')}, Python {sys.version.split()[0]})"
    )


@pytest.mark.parametrize("name", ["breakdown", "whatif"])
def test_the_version_filter_is_model_version_and_the_old_spelling_is_hidden(name: str) -> None:
    command = leaf_commands()[name]
    options = {opt: p for p in command.params for opt in getattr(p, "opts", ())}
    assert options["--model-version"].name == "version" and not getattr(options["--model-version"], "hidden", True)
    assert options["--version"].name == "old_version" and getattr(options["--version"], "hidden", False)
    assert "--model-version" in command.get_help(click.Context(command))


def test_the_old_spelling_works_with_a_warning_on_stderr() -> None:
    @click.command()
    @model_version_option("a version")
    def show(version: str | None, old_version: str | None) -> None:
        click.echo(json.dumps({"version": model_version(version, old_version)}))

    runner = CliRunner()
    new = runner.invoke(show, ["--model-version", "v2"])
    assert (new.exit_code, json.loads(new.stdout), new.stderr) == (0, {"version": "v2"}, "")
    old = runner.invoke(show, ["--version", "v2"])
    assert old.exit_code == 0 and json.loads(old.stdout) == {"version": "v2"}  # stdout stays parseable
    assert "--version is deprecated" in old.stderr and "--model-version" in old.stderr
    assert runner.invoke(show, ["--version", "v2", "--model-version", "v2"]).exit_code == 0
    clash = runner.invoke(show, ["--version", "v1", "--model-version", "v2"])
    assert clash.exit_code == 2 and "disagree" in clash.stderr


def test_json_logs_are_one_object_per_line_with_the_exception_and_extras() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("ttft.test").makeRecord(
            "ttft.test", logging.ERROR, __file__, 1, "join %s failed", ("p3",), sys.exc_info(), extra={"partition": 3}
        )
    line = JsonLogFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "error" and entry["logger"] == "ttft.test" and entry["message"] == "join p3 failed"
    assert entry["partition"] == 3 and "ValueError: boom" in entry["exc"] and entry["ts"].endswith("+00:00")


def test_the_workers_logging_config_is_valid_for_both_formats() -> None:
    for fmt in ("text", "json"):
        config = logging_config("info", fmt)
        assert config["root"] == {"level": "INFO", "handlers": ["stderr"]}
    assert logging_config("nonsense", "json")["root"]["level"] == "WARNING"
    formatter = logging_config("info", "json")["formatters"]["ttft"]["()"]
    module, _, name = formatter.rpartition(".")
    assert getattr(sys.modules[module], name) is JsonLogFormatter


def test_config_check_json(tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(main, ["config", "check", "--json", str(REPO / "deploy/config/ttft.yaml")])
    assert good.exit_code == 0
    report = json.loads(good.stdout)
    assert report["ok"] and report["problems"] == [] and report["spans"][0] == "window: 60 s"
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("windows: {window_s: 0}\nrulez: {}\n")
    bad = runner.invoke(main, ["config", "check", "--json", str(bad_file)])
    assert bad.exit_code == 1
    report = json.loads(bad.stdout)
    assert not report["ok"] and "rulez: unknown setting" in report["problems"] and report["spans"] == []


def test_config_default_prints_the_shipped_config() -> None:
    result = CliRunner().invoke(main, ["config", "default"])
    assert result.exit_code == 0 and result.stdout == (REPO / "deploy/config/ttft.yaml").read_text(encoding="utf-8")


def test_grafana_build_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "grafana",
            "build",
            "--json",
            "--out",
            str(tmp_path),
            "--import-out",
            str(tmp_path / "import"),
            "--rules-file",
            str(tmp_path / "rules.yaml"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # six dashboards, their six import files and the rules
    assert len(report["dashboards"]) == 6 and len(report["changed"]) == 13


def test_simulate_json_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    args = ["simulate", "--json", "--duration", "5", "--rate", "4", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["events"] == len(out.read_text().splitlines()) > 0 and report["out"] == str(out)
    refused = CliRunner().invoke(main, ["simulate", "--json", "--out", "-"])
    assert refused.exit_code == 2 and "--json prints on stdout" in refused.stderr


@pytest.mark.parametrize("group", ["kafka", "otel"])
def test_status_json_when_nothing_runs(group: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_HOME", str(tmp_path))
    result = CliRunner().invoke(main, [group, "status", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["running"] is False and report["pid"] is None


class RecordingClient:
    """Just enough of a clickhouse-connect client for the migration runner."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def command(self, sql: str, settings: Any = None) -> None:
        self.commands.append(sql)

    def query(self, sql: str) -> Any:
        return type("Result", (), {"result_rows": []})()

    def insert(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_db_migrate_reports_each_statement_before_and_after_it_runs() -> None:
    ticks = iter(float(i) for i in range(10_000))
    steps: list[MigrationStep] = []
    client = RecordingClient()
    applied = apply_migrations(client, "ttft", progress=steps.append, clock=lambda: next(ticks))  # type: ignore[arg-type]
    before = [s for s in steps if s.seconds is None]
    after = [s for s in steps if s.seconds is not None]
    assert len(before) == len(after) == len([c for c in client.commands if "schema_migrations" not in c]) - 1
    assert [s.name for s in before if s.index == 1] == applied
    assert before[0].pending == len(applied) and before[-1].pending == 1
    assert all(a.seconds == 1.0 and a.index <= a.total for a in after)
    assert all(len(s.summary) <= 72 and not s.summary.startswith("--") for s in before)
