"""TTFTTenantSilent: a tenant seen before that sends no records for ``silent_windows`` windows (a ticket).

After ``forget_windows`` of silence the tenant is forgotten and its alert resolves. Only registered tenants
are watched (configured, or promoted by ``tenancy.steady_windows``: streams.core.tenancy): a made-up tenant
id that sent one request is no reason for a ticket (an unregistered tenant already watched, e.g. restored,
is forgotten).
"""

from __future__ import annotations

from collections.abc import Callable

from streams.rules.lifecycle import AlertBook, AlertKey, Signal
from streams.rules.model import AlertTransition, Outcome
from streams.rules_config import TenantSilenceRule


def silence_steps(
    rule: TenantSilenceRule,
    tenant_seen: dict[str, float],
    alerts: AlertBook,
    now: float,
    window_ms: float,
    note: Callable[[AlertKey, Outcome], None],
    registered: frozenset[str] | None = None,
) -> list[AlertTransition]:
    """Step every known tenant's silence alert; ``tenant_seen`` (tenant -> last window with records) is
    updated by the caller and pruned here (``registered``: the only tenants watched; None: all)."""
    out: list[AlertTransition] = []
    for tenant in sorted(tenant_seen):
        key: AlertKey = ("TTFTTenantSilent", tenant, "", "")
        silent = round((now - tenant_seen[tenant]) / window_ms)
        if silent >= rule.forget_windows or (registered is not None and tenant not in registered):
            del tenant_seen[tenant]
            if alerts.get(key) is not None:
                out.append(alerts.resolve(key, now, f"tenant {tenant} silent for {silent} windows: forgotten"))
            continue
        signal: Signal = "clear" if silent == 0 else "breach" if silent >= rule.silent_windows else "hold"
        note(key, "breach" if signal == "breach" else "ok")
        out += alerts.step(
            key,
            signal,
            now,
            severity="ticket",
            immediate=True,
            summary=f"Tenant {tenant} sends no telemetry",
            description=(
                f"no request records from tenant {tenant} for {silent} windows "
                f"(threshold {rule.silent_windows}); it sent data before."
            ),
            numbers={"silent_windows": float(silent)},
        )
    return out
