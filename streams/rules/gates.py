"""Gates that keep a rule silent, said where on-call looks (``ttft rules status``, the pipeline-health board).

A rule that cannot page is indistinguishable from a rule that found nothing, unless the gate says so. The
gates of a writer's configuration:

- ``rule_paused``: a rule switched off (``rules.<rule>.enabled: false``, ``rules.watchdog: false``);
- ``paging_muted``: ``paging_muted`` set, every alert is stored and none is paged;
- ``registered_only``: ``TTFTTenantSilent`` watches only the registered tenants (configured, and, with
  ``tenancy.steady_windows``, promoted by their steady traffic: streams.core.tenancy); the shared pool's
  tenants are never watched, whatever they send or stop sending.

and, from the join, ``quarantined``: a source the dead-letter guard holds (its invalid events are
dead-lettered and no longer judged; :mod:`streams.views.quarantines`).

The writer publishes its gates at start to ``ttft.rule-evaluations`` under the key :data:`GATES_KEY` (read
by ``ttft rules status``, which falls back to its own configuration when no writer published yet) and
stores them, with the quarantines, in the ``rule_gates`` table (the board's "What keeps rules silent").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from streams.settings import Settings

#: The ``ttft.rule-evaluations`` key of the writer's gates (not a series key: those are ``tenant|rule|...``).
GATES_KEY = b"__gates__"
GATES_KIND = "rule_gates"
#: The kinds of gate, in the order they are shown.
GATE_KINDS: tuple[str, ...] = ("paging_muted", "rule_paused", "registered_only", "quarantined")
#: How many tenant ids a gate's scope names before it says "and N more".
SCOPE_TENANTS = 10

#: The rules config section of each alert a rule section can switch off.
RULE_SECTIONS: tuple[tuple[str, str], ...] = (
    ("stage_regression", "TTFTStageRegression"),
    ("canary", "TTFTCanaryFailed"),
    ("draft_acceptance", "TTFTDraftAcceptanceLow"),
    ("slo_burn", "TTFTSLOBurn"),
    ("telemetry", "TTFTTelemetryDegraded"),
    ("tenant_silence", "TTFTTenantSilent"),
    ("undecidable", "TTFTRuleUndecidable"),
)


@dataclass(frozen=True, slots=True)
class Gate:
    """One reason a rule stays silent: its kind, the alert it silences (``*``: all), what it covers."""

    gate: str
    rule: str
    scope: str
    detail: str
    since_ms: float | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.gate, self.rule, self.scope)


def config_gates(settings: Settings) -> list[Gate]:
    """The gates of a configuration (every kind but ``quarantined``, which the join decides)."""
    gates: list[Gate] = []
    if settings.paging_muted:
        gates.append(
            Gate("paging_muted", "*", "", "paging_muted is set: every alert is stored, none is paged (counted)")
        )
    rules = settings.rules
    for section, alertname in RULE_SECTIONS:
        if not getattr(rules, section).enabled:
            gates.append(Gate("rule_paused", alertname, "", f"rules.{section}.enabled is false: never evaluated"))
    if not rules.watchdog:
        gates.append(Gate("rule_paused", "Watchdog", "", "rules.watchdog is false: no heartbeat alert"))
    registered = settings.registered_tenants()
    if rules.tenant_silence.enabled:
        steady = settings.tenancy.steady_windows
        listed = [_tenants(registered)] if registered else []
        scope = " + ".join([*listed, *(["steady tenants"] if steady else [])]) or "no tenant"
        promoted = f" and those with requests in {steady} consecutive windows" if steady else ""
        gates.append(
            Gate(
                "registered_only",
                "TTFTTenantSilent",
                scope,
                f"only registered tenants are watched for silence: the {len(registered)} configured{promoted}; "
                "the shared pool's tenants are not",
            )
        )
    return gates


def _tenants(tenants: Iterable[str]) -> str:
    names = sorted(tenants)
    if not names:
        return "no tenant"
    shown = ", ".join(names[:SCOPE_TENANTS])
    return shown if len(names) <= SCOPE_TENANTS else f"{shown} and {len(names) - SCOPE_TENANTS} more"


def sorted_gates(gates: Iterable[Gate]) -> list[Gate]:
    order = {kind: i for i, kind in enumerate(GATE_KINDS)}
    return sorted(gates, key=lambda g: (order.get(g.gate, len(order)), g.rule, g.scope))


def gate_lines(gates: Iterable[Gate]) -> list[str]:
    """One line per gate for ``ttft rules status`` (quarantines have their own lines)."""
    words = {"paging_muted": "MUTED", "rule_paused": "PAUSED", "registered_only": "UNWATCHED"}
    lines = []
    for g in sorted_gates(gates):
        if g.gate == "quarantined":
            continue
        what = "every alert" if g.rule == "*" else g.rule
        scope = f" (watches: {g.scope})" if g.gate == "registered_only" else ""
        lines.append(f"{words.get(g.gate, g.gate.upper())} {what}{scope}: {g.detail}")
    return lines


def gate_records(gates: Iterable[Gate]) -> list[dict[str, Any]]:
    """The gates as JSON objects (``ttft rules status --json``)."""
    return [asdict(g) for g in sorted_gates(gates)]


def gates_message(gates: Iterable[Gate], writer_id: str, at_ms: float) -> bytes:
    """The writer's gates as one ``ttft.rule-evaluations`` value (key :data:`GATES_KEY`)."""
    return orjson.dumps(
        {"kind": GATES_KIND, "writer_id": writer_id, "at_ms": at_ms, "gates": [asdict(g) for g in gates]}
    )


def is_gates_message(message: Any) -> bool:
    return isinstance(message, dict) and message.get("kind") == GATES_KIND


def gates_from_message(message: dict[str, Any]) -> list[Gate]:
    """The gates of a :func:`gates_message` (malformed entries skipped)."""
    out = []
    for entry in message.get("gates") or ():
        if not isinstance(entry, dict):
            continue
        since = entry.get("since_ms")
        out.append(
            Gate(
                str(entry.get("gate", "")),
                str(entry.get("rule", "")),
                str(entry.get("scope", "")),
                str(entry.get("detail", "")),
                float(since) if isinstance(since, int | float) else None,
            )
        )
    return out


def gate_rows(gates: Iterable[Gate], active: bool, at_ms: float) -> list[dict[str, Any]]:
    """``rule_gates`` rows (deploy/clickhouse/migrations/0014_rule_gates.sql)."""
    from datetime import UTC, datetime

    def when(ms: float | None) -> datetime:
        return datetime.fromtimestamp((ms if ms is not None else at_ms) / 1000.0, tz=UTC)

    return [
        {
            "gate": g.gate,
            "rule": g.rule,
            "scope": g.scope,
            "detail": g.detail,
            "active": active,
            "since": when(g.since_ms),
            "updated_at": when(at_ms),
        }
        for g in gates
    ]
