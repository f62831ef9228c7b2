"""Where an alert leads: its Grafana board, pre-filtered on its tenant, stage, version and time range, and
its runbook section.

One function, :meth:`AlertLinks.annotations`, computes every link from an alert's labels and event times
only, so the rule engine (for the ``alerts`` table) and the delivery loop (for Alertmanager, with the
settings it runs with, for alerts it did not make, such as the ingest guard's) give the same links.
Alertmanager's ``generatorURL`` is the ``dashboard_url``.

Board uids and variable names are those of ``dashboards/*.json``; a test renders every link of every
alert and checks each target there. The ``tenant`` and ``version`` variables take the upper-case hex of
the id's UTF-8 bytes (what ClickHouse's ``hex()`` gives: ``streams/grafana/sql.py``), so no byte of an id
reaches a panel's SQL; ``stage`` takes the stage name.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final
from urllib.parse import urlencode, urlsplit

from streams.rules.model import RUNBOOK_PATH, AlertTransition, runbook_url

__all__ = ["RUNBOOK_PATH", "AlertLinks", "Board", "board_url", "hex_id", "placeholder_problem", "runbook_url"]

#: Default span a board link shows before the alert went pending (windows).
LOOKBACK_WINDOWS: Final = 60
#: ... and after the transition's window (windows), so the window that decided it is on screen.
AFTER_WINDOWS: Final = 2
#: Board variables whose values are the hex of the id (``streams/grafana/sql.py``: ``hex_variable_sql``).
HEX_VARIABLES: Final = frozenset({"tenant", "version"})


@dataclass(frozen=True, slots=True)
class Board:
    """A provisioned dashboard: its uid and the variables a link may set."""

    uid: str
    variables: tuple[str, ...]


OVERVIEW: Final = Board("ttft-overview", ("tenant", "version"))
STAGES: Final = Board("ttft-stages", ("tenant", "version", "stage"))
CANARY: Final = Board("ttft-canary", ("tenant", "version", "stage"))
LEVERS: Final = Board("ttft-llm-levers", ("tenant", "version"))
HEALTH: Final = Board("ttft-pipeline-health", ("tenant",))
#: One request's stages (``request_id`` is a text box: the id itself, URL-encoded by the link).
REQUEST: Final = Board("ttft-request", ("tenant", "request_id"))
BOARDS: Final = (OVERVIEW, STAGES, CANARY, LEVERS, HEALTH, REQUEST)

#: The board each alert opens on; an alert not named here (a new one) opens the health board.
BOARD_OF_ALERT: Final[Mapping[str, Board]] = {
    "TTFTStageRegression": STAGES,
    "TTFTCanaryFailed": CANARY,
    "TTFTDraftAcceptanceLow": LEVERS,
    "TTFTSLOBurn": OVERVIEW,
    "TTFTTelemetryDegraded": HEALTH,
    "TTFTTenantSilent": HEALTH,
    "TTFTIngestHalted": HEALTH,
    "TTFTSourceQuarantined": HEALTH,
    "TTFTRuleUndecidable": HEALTH,
    "Watchdog": HEALTH,
}

#: Annotation naming the stage that moved most (TTFTSLOBurn); its drill-down link is ``stage_dashboard_url``.
MOVED_STAGE: Final = "moved_stage"
#: Annotation holding example request ids from tail attribution (a JSON array of strings).
EXEMPLARS: Final = "exemplar_request_ids"


def hex_id(value: str) -> str:
    """A tenant or version id as its board variable value: upper-case hex of its UTF-8 bytes."""
    return value.encode("utf-8").hex().upper()


def board_url(
    grafana_url: str | None,
    board: Board,
    values: Mapping[str, str],
    from_ms: float,
    to_ms: float,
) -> str:
    """``{grafana_url}/d/{uid}?orgId=1&from=..&to=..&var-..`` with each variable the board has and ``values``
    sets (ids hex-encoded). Without a Grafana URL the link is a path (``/d/...``): Alertmanager accepts it
    as ``generatorURL`` and Grafana resolves it against itself."""
    query: list[tuple[str, str]] = [("orgId", "1"), ("from", str(int(from_ms))), ("to", str(int(to_ms)))]
    for name in board.variables:
        value = values.get(name, "")
        if value:
            query.append((f"var-{name}", hex_id(value) if name in HEX_VARIABLES else value))
    return f"{(grafana_url or '').strip().rstrip('/')}/d/{board.uid}?{urlencode(query)}"


@dataclass(frozen=True, slots=True)
class AlertLinks:
    """The deployment's link targets (``rules.grafana_url``, ``rules.runbook_base_url``) and window size."""

    grafana_url: str | None
    runbook_base_url: str | None
    window_ms: float
    lookback_windows: int = LOOKBACK_WINDOWS

    def time_range(self, transition: AlertTransition) -> tuple[float, float]:
        """From ``lookback_windows`` before the alert went pending to ``AFTER_WINDOWS`` past this transition."""
        start = min(transition.active_at, transition.window_start)
        end = max(transition.event_at, transition.window_start) + AFTER_WINDOWS * self.window_ms
        return start - self.lookback_windows * self.window_ms, end

    def annotations(self, transition: AlertTransition) -> dict[str, str]:
        """``runbook_url``, ``dashboard_url``; ``stage_dashboard_url`` when the alert names a moved stage;
        ``exemplar_url`` (the request board on its slowest example request) when it has examples."""
        labels = transition.labels
        values = {name: labels.get(name, "") for name in ("tenant", "version", "stage")}
        board = BOARD_OF_ALERT.get(transition.alertname, HEALTH)
        start, end = self.time_range(transition)
        out = {
            "runbook_url": runbook_url(self.runbook_base_url, transition.alertname),
            "dashboard_url": board_url(self.grafana_url, board, values, start, end),
        }
        moved = transition.annotations.get(MOVED_STAGE)
        if moved:
            out["stage_dashboard_url"] = board_url(self.grafana_url, STAGES, {**values, "stage": moved}, start, end)
        exemplars = _exemplars(transition.annotations.get(EXEMPLARS, ""))
        if exemplars:
            request = {"tenant": values["tenant"], "request_id": exemplars[0]}
            out["exemplar_url"] = board_url(self.grafana_url, REQUEST, request, start, end)
        return out

    def annotate(self, transition: AlertTransition) -> AlertTransition:
        """A copy of ``transition`` whose annotations carry its links (replacing older ones)."""
        return replace(transition, annotations={**transition.annotations, **self.annotations(transition)})


def _exemplars(text: str) -> list[str]:
    """The ids of an ``exemplar_request_ids`` annotation (a JSON list; anything else: none)."""
    try:
        ids = json.loads(text) if text else []
    except ValueError:
        return []
    return [str(i) for i in ids] if isinstance(ids, list) else []


# --- deployment checks (``ttft config check``) ----------------------------------------------------------

#: The repository URL the runbook base defaulted to before it became a deployment setting.
OLD_DEFAULT_RUNBOOK: Final = "https://github.com/ttft-pipeline/ttft-pipeline/"
_PLACEHOLDER_HOSTS: Final = frozenset({"example.com", "example.org", "example.net", "example", "host", "hostname"})
#: Reserved top-level names (RFC 2606 / 6761) that never resolve to a real deployment.
_PLACEHOLDER_SUFFIXES: Final = (".example", ".invalid", ".test", ".example.com", ".example.org", ".example.net")
_PLACEHOLDER_WORDS: Final = ("placeholder", "<", ">", "your-", "changeme", "change-me", "todo")


def placeholder_problem(url: str | None, setting: str) -> str | None:
    """Why ``url`` cannot be a deployment's value of ``setting`` (a placeholder, not a URL), else None.

    Empty is not a problem (the setting is unset); a relative or scheme-less value, an example or reserved
    host (RFC 2606/6761), placeholder words, and the old default repository URL are.
    """
    value = (url or "").strip()
    if not value:
        return None
    how = f"set {setting} to where this deployment serves it"
    lowered = value.lower()
    if lowered.startswith(OLD_DEFAULT_RUNBOOK):
        return f"{value!r} is the old placeholder repository URL, not this deployment's: {how}"
    if any(word in lowered for word in _PLACEHOLDER_WORDS):
        return f"{value!r} is a placeholder: {how}"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https", "file"):
        return f"{value!r} is not an absolute http://, https:// or file:// URL: {how}"
    if parts.scheme == "file":
        return None if parts.path.startswith("/") else f"{value!r} names no absolute file path: {how}"
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return f"{value!r} names no host: {how}"
    if host in _PLACEHOLDER_HOSTS or host.endswith(_PLACEHOLDER_SUFFIXES):
        return f"{value!r} is an example host ({host}), a placeholder: {how}"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.is_unspecified:
        return f"{value!r} names the unspecified address {host}, which no browser can open: {how}"
    return None
