"""``ttft rules status``: the gates that keep rules silent, the quarantined sources, then per tenant x rule
the span last used, its samples, the last outcome and when the rule last could decide. Reads the
``ttft.rule-evaluations`` and ``ttft.alerts`` topics, so it works while the worker runs."""

from __future__ import annotations

import asyncio

import click
from aiokafka.errors import KafkaError

from streams.cli.conventions import echo_json, json_option
from streams.rules.gates import config_gates, gate_lines, gate_records
from streams.settings import Settings, load_settings
from streams.views.quarantines import Quarantine, quarantine_lines, quarantine_records, read_quarantines
from streams.views.rule_status import (
    fold_gates,
    fold_statuses,
    read_topic_values,
    render_status,
    status_records,
    status_rows,
)


@click.group()
def rules() -> None:
    """Alert rules: what they decided and on how much evidence."""


@rules.command("status")
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--all", "all_rules", is_flag=True, help="Every rule, not only regression and canary.")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True)
@json_option(
    "Print one object: gates (what keeps rules silent), quarantines, and series (one object per tenant x rule "
    "series); times in epoch ms."
)
def status(tenant: str | None, all_rules: bool, timeout_s: float, as_json: bool) -> None:
    """Per tenant x rule: span used last, its samples, last outcome, when it last could decide.

    Outcomes in capitals did not decide (INSUFFICIENT_TRAFFIC: even the largest span lacked samples).
    First come the gates that keep rules silent: MUTED (paging_muted), PAUSED (a rule switched off),
    UNWATCHED (the silence rule watches registered tenants only: configured or steady), as the writer
    published them (else as this command's configuration has them), and a line per source the dead-letter
    guard holds in quarantine (QUARANTINED ...).
    """
    settings = load_settings()
    topic = settings.topic("rule-evaluations")
    try:
        values = asyncio.run(read_topic_values(settings, topic, timeout_s=timeout_s))
    except (KafkaError, OSError, RuntimeError, TimeoutError) as exc:
        raise click.ClickException(f"cannot read {topic}: {exc}") from exc
    statuses = fold_statuses(values)
    published = fold_gates(values)
    gates = published if published is not None else config_gates(settings)
    quarantines = _quarantines(settings, tenant, timeout_s)
    if as_json:
        echo_json(
            {
                "gates": gate_records(gates),
                "gates_from": "writer" if published is not None else "config",
                "quarantines": None if quarantines is None else quarantine_records(quarantines),
                "series": status_records(statuses, tenant=tenant, all_rules=all_rules),
            }
        )
        return
    for line in gate_lines(gates):
        click.echo(line)
    if published is None and gates:
        click.echo("(gates as this command's configuration has them: no writer has published its own yet)", err=True)
    for line in quarantine_lines(quarantines or []):
        click.echo(line)
    rows = status_rows(statuses, tenant=tenant, all_rules=all_rules)
    if not rows:
        scope = f" for tenant {tenant}" if tenant else ""
        click.echo(f"no rule evaluations{scope} yet (the worker evaluates when windows close)")
        return
    click.echo(render_status(rows), nl=False)


def _quarantines(settings: Settings, tenant: str | None, timeout_s: float) -> list[Quarantine] | None:
    """The quarantined sources (a tenant filter keeps that tenant's and the tenant-less ones); best effort:
    None, with a warning on stderr, when ``ttft.alerts`` cannot be read."""
    try:
        found = asyncio.run(read_quarantines(settings, timeout_s=timeout_s))
    except (KafkaError, OSError, RuntimeError, TimeoutError) as exc:
        click.echo(f"(quarantines unknown: cannot read {settings.topic('alerts')}: {exc})", err=True)
        return None
    return [q for q in found if tenant is None or q.tenant in ("", tenant)]
