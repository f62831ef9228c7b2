"""The ``ttft`` command. Sub-commands live in their own modules and load on first use."""

from __future__ import annotations

import importlib
import platform
import sys
import traceback
from typing import Any

import click

#: command name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, str] = {
    "kafka": "streams.cli.kafka_cmd:kafka",
    "worker": "streams.cli.worker_cmd:worker",
    "db": "streams.cli.db_cmd:db",
    "request": "streams.cli.request_cmd:request",
    "breakdown": "streams.cli.breakdown_cmd:breakdown",
    "simulate": "streams.cli.simulate_cmd:simulate",
    "demo": "streams.cli.demo_cmd:demo",
    "top": "streams.cli.top_cmd:top",
    "report": "streams.cli.report_cmd:report",
    "replay": "streams.cli.replay_cmd:replay",
    "config": "streams.cli.config_cmd:config",
    "grafana": "streams.cli.grafana_cmd:grafana",
    "rules": "streams.cli.rules_cmd:rules",
    "otel": "streams.cli.otel_cmd:otel",
    "whatif": "streams.cli.whatif_cmd:whatif",
}


class LazyGroup(click.Group):
    """Imports a sub-command's module only when that command runs (keeps ``ttft --help`` fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return _unavailable(cmd_name)
            raise
        command: Any = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


def _unavailable(name: str) -> click.Command:
    @click.command(name=name, help="(not available in this build)")
    def _cmd() -> None:
        raise click.ClickException(f"'ttft {name}' is not available in this build")

    return _cmd


def version_text() -> str:
    """``ttft 0.1.0 (ttft-emit 0.1.0, Python 3.11.7)``: the installed distributions' versions."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"ttft {of('ttft-pipeline')} (ttft-emit {of('ttft-emit')}, Python {platform.python_version()})"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the versions of ttft, ttft-emit and Python, and exit.",
)
def main() -> None:
    """ttft-pipeline: stage-level time-to-first-token measurement for LLM/RAG services."""


def run() -> None:
    """The ``ttft`` executable: :func:`main`, then the real exit status, even after using the embedded store.

    A command that opened chDB ends through :func:`streams.store.shutdown.end_process`, so the engine's
    native teardown (which can crash with SIGSEGV) never replaces the command's own status.
    """
    try:
        main()
    except SystemExit as exc:
        _end(exc.code)
        raise
    except BaseException:
        _end_after_crash()
        raise


def _end(code: object) -> None:
    from streams.store.shutdown import end_process, exit_status, store_opened

    if not store_opened():
        return
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what sys.exit("message") would have printed
    end_process(exit_status(code))


def _end_after_crash() -> None:
    from streams.store.shutdown import end_process, store_opened

    if store_opened():
        traceback.print_exc()
        end_process(1)


if __name__ == "__main__":  # pragma: no cover
    run()
