"""``ttft rules status``: per tenant x rule, the span last used, its samples, the last outcome and when
the rule last could decide. Reads the ``ttft.rule-evaluations`` topic, so it works while the worker runs."""

from __future__ import annotations

import asyncio

import click
from aiokafka.errors import KafkaError

from streams.cli.conventions import echo_json, json_option
from streams.settings import Settings, load_settings
from streams.views.quarantines import quarantine_lines, read_quarantines
from streams.views.rule_status import read_statuses, render_status, status_records, status_rows


@click.group()
def rules() -> None:
    """Alert rules: what they decided and on how much evidence."""


@rules.command("status")
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--all", "all_rules", is_flag=True, help="Every rule, not only regression and canary.")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True)
@json_option("Print one object per tenant x rule series as a JSON list (times in epoch ms).")
def status(tenant: str | None, all_rules: bool, timeout_s: float, as_json: bool) -> None:
    """Per tenant x rule: span used last, its samples, last outcome, when it last could decide.

    Outcomes in capitals did not decide (INSUFFICIENT_TRAFFIC: even the largest span lacked samples).
    A line per source the dead-letter guard holds in quarantine comes first (QUARANTINED ...).
    """
    settings = load_settings()
    try:
        statuses = asyncio.run(read_statuses(settings, timeout_s=timeout_s))
    except (KafkaError, OSError, RuntimeError, TimeoutError) as exc:
        raise click.ClickException(f"cannot read {settings.topic('rule-evaluations')}: {exc}") from exc
    if as_json:
        echo_json(status_records(statuses, tenant=tenant, all_rules=all_rules))
        return
    _echo_quarantines(settings, tenant, timeout_s)
    rows = status_rows(statuses, tenant=tenant, all_rules=all_rules)
    if not rows:
        scope = f" for tenant {tenant}" if tenant else ""
        click.echo(f"no rule evaluations{scope} yet (the worker evaluates when windows close)")
        return
    click.echo(render_status(rows), nl=False)


def _echo_quarantines(settings: Settings, tenant: str | None, timeout_s: float) -> None:
    """The quarantine lines (a tenant filter keeps that tenant's and the tenant-less sources'); best effort."""
    try:
        found = asyncio.run(read_quarantines(settings, timeout_s=timeout_s))
    except (KafkaError, OSError, RuntimeError, TimeoutError) as exc:
        click.echo(f"(quarantines unknown: cannot read {settings.topic('alerts')}: {exc})", err=True)
        return
    for line in quarantine_lines([q for q in found if tenant is None or q.tenant in ("", tenant)]):
        click.echo(line)
