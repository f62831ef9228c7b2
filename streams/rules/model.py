"""Plain data of the alerting core: the window snapshot rules read, and the rows they emit.

Alert identity is its labels (``alertname``, ``tenant``, ``stage``, ``version``, ``severity``; absent ones
left out). Numbers never go in labels, only in ``numbers``/annotations, so a changing value never makes a
new alert. Transition times are event time (window starts, epoch ms): a replay produces the same rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

AlertState = Literal["pending", "firing", "resolved"]
Arm = Literal["stable", "canary"]
Outcome = Literal["ok", "breach", "hold", "inconclusive", "insufficient_traffic", "insufficient_history", "degraded"]
#: Outcomes that decided something: the rule could tell "fine" from "wrong" (``hold`` is the hysteresis band).
DECIDED_OUTCOMES: frozenset[str] = frozenset({"ok", "breach", "hold"})
VerdictValue = Literal["pass", "fail", "inconclusive", "insufficient_traffic"]

ALERT_NAMES: tuple[str, ...] = (
    "TTFTStageRegression",
    "TTFTCanaryFailed",
    "TTFTDraftAcceptanceLow",
    "TTFTSLOBurn",
    "TTFTTelemetryDegraded",
    "TTFTTenantSilent",
    "TTFTIngestHalted",
    "TTFTSourceQuarantined",
    "TTFTRuleUndecidable",
    "Watchdog",
)
#: Paged by the join's dead-letter guard for each source it quarantines (label ``source``; ``tenant`` for a tenant).
SOURCE_QUARANTINED = "TTFTSourceQuarantined"
IDENTITY_LABELS: tuple[str, ...] = ("alertname", "tenant", "stage", "version", "severity")


#: Where ``runbook_url`` points while ``rules.runbook_base_url`` is unset: the runbook's path in the repository.
RUNBOOK_PATH = "docs/runbook.md"


def runbook_url(base_url: str | None, alertname: str) -> str:
    """Link to the alert's section of the runbook (heading anchors are lower case); with no base URL set,
    the runbook's path in the repository, which names the section without pretending to be a link."""
    base = (base_url or "").strip().rstrip("#") or RUNBOOK_PATH
    return f"{base}#{alertname.lower()}"


def fingerprint(labels: Mapping[str, str]) -> str:
    """Stable identity of an alert: sha256 of its sorted labels, 16 hex digits."""
    blob = json.dumps(sorted(labels.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def ms_to_datetime(ms: float | None) -> datetime | None:
    """Epoch milliseconds as an aware UTC datetime (``None`` stays ``None``)."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000.0, tz=UTC)


@dataclass(frozen=True, slots=True)
class AlertTransition:
    """One lifecycle step of one alert: the row of ``ttft.alerts`` and of the ``alerts`` table.

    ``active_at`` is when it went pending, ``fired_at`` when it started firing, ``resolved_at`` when it
    cleared (all window starts, ms). ``muted`` marks a replay/backfill transition: stored, never paged.
    """

    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    numbers: dict[str, float]
    state: AlertState
    window_start: float
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    muted: bool = False
    #: A *claim* on a shared alert: one of several holders of the same alert (the join workers' partitions
    #: that hold a quarantine), ``{"holder": ..., ...}``. The alert fires with its first holder's claim and
    #: resolves with its last one's (:class:`streams.alerting.outbox.DeliveryState`); each claim is its own
    #: key on ``ttft.alerts`` (:attr:`topic_key`), so compaction keeps every holder's latest claim.
    claim: dict[str, str] | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    @property
    def topic_key(self) -> str:
        """The ``ttft.alerts`` key: the fingerprint, with the holder of a claim."""
        if self.claim is None:
            return self.fingerprint
        return f"{self.fingerprint}|{self.claim.get('holder', '')}"

    @property
    def event_at(self) -> float:
        """Event time of this transition: when it went pending, fired or resolved."""
        if self.state == "resolved" and self.resolved_at is not None:
            return self.resolved_at
        if self.state == "firing" and self.fired_at is not None:
            return self.fired_at
        return self.active_at

    def to_message(self) -> dict[str, Any]:
        """JSON-ready value for the ``ttft.alerts`` topic (key: the fingerprint)."""
        return {
            "fingerprint": self.fingerprint,
            "alertname": self.alertname,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "numbers": dict(self.numbers),
            "state": self.state,
            "window_start": self.window_start,
            "active_at": self.active_at,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "muted": self.muted,
            **({"claim": dict(self.claim)} if self.claim is not None else {}),
        }

    @classmethod
    def from_message(cls, data: Mapping[str, Any]) -> AlertTransition:
        """Inverse of :meth:`to_message`; raises ``KeyError``/``ValueError`` on a malformed message."""
        state = data["state"]
        if state not in ("pending", "firing", "resolved"):
            raise ValueError(f"unknown alert state {state!r}")
        return cls(
            alertname=str(data["alertname"]),
            labels={str(k): str(v) for k, v in data["labels"].items()},
            annotations={str(k): str(v) for k, v in data.get("annotations", {}).items()},
            numbers={str(k): float(v) for k, v in data.get("numbers", {}).items()},
            state=state,
            window_start=float(data["window_start"]),
            active_at=float(data["active_at"]),
            fired_at=None if data.get("fired_at") is None else float(data["fired_at"]),
            resolved_at=None if data.get("resolved_at") is None else float(data["resolved_at"]),
            muted=bool(data.get("muted", False)),
            claim=_claim(data.get("claim")),
        )

    def to_row(self) -> dict[str, Any]:
        """Column values for the ``alerts`` table (deploy/clickhouse/migrations/0006_alerts.sql)."""
        return {
            "fingerprint": self.fingerprint,
            "alertname": self.alertname,
            "tenant_id": self.labels.get("tenant", ""),
            "stage": self.labels.get("stage", ""),
            "version_id": self.labels.get("version", ""),
            "severity": self.labels.get("severity", ""),
            "state": self.state,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "numbers": dict(self.numbers),
            "window_start": ms_to_datetime(self.window_start),
            "event_at": ms_to_datetime(self.event_at),
            "active_at": ms_to_datetime(self.active_at),
            "fired_at": ms_to_datetime(self.fired_at),
            "resolved_at": ms_to_datetime(self.resolved_at),
            "muted": self.muted,
        }


def _claim(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"an alert's claim is an object, not {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


ALERT_COLUMNS: tuple[str, ...] = tuple(AlertTransition("x", {}, {}, {}, "pending", 0.0, 0.0).to_row().keys())


@dataclass(frozen=True, slots=True)
class CanaryVerdict:
    """One canary evaluation of one tenant x stage x canary version: a ``canary_verdicts`` row.

    ``p95_*`` and ``ratio`` are the verdict values (canary reweighted to the stable stratum mix when
    ``mix_adjusted``); ``naive_*`` compare the arms' merged sketches without reweighting.
    """

    window_start: float
    tenant_id: str
    stage: str
    canary_version: str
    stable_versions: tuple[str, ...]
    verdict: VerdictValue
    reason: str
    n_canary: int
    n_stable: int
    p95_canary: float | None = None
    p95_stable: float | None = None
    ratio: float | None = None
    delta_ms: float | None = None
    tail_share_canary: float | None = None
    tail_share_stable: float | None = None
    tail_z: float | None = None
    tail_p: float | None = None
    naive_p95_canary: float | None = None
    naive_ratio: float | None = None
    naive_verdict: VerdictValue | None = None
    mix_adjusted: bool = False
    mix_coverage: float | None = None
    drivers: tuple[str, ...] = ()
    explanation: str = ""
    span_windows: int = 0

    def numbers(self) -> dict[str, float]:
        """The verdict's numbers for an alert's annotations."""
        values = {
            "ratio": self.ratio,
            "p95_canary_ms": self.p95_canary,
            "p95_stable_ms": self.p95_stable,
            "naive_ratio": self.naive_ratio,
            "tail_p": self.tail_p,
            "n_canary": float(self.n_canary),
            "n_stable": float(self.n_stable),
        }
        return {k: v for k, v in values.items() if v is not None}

    def to_row(self) -> dict[str, Any]:
        """Column values for the ``canary_verdicts`` table."""
        return {
            "window_start": ms_to_datetime(self.window_start),
            "tenant_id": self.tenant_id,
            "stage": self.stage,
            "canary_version": self.canary_version,
            "stable_versions": list(self.stable_versions),
            "verdict": self.verdict,
            "reason": self.reason,
            "n_canary": self.n_canary,
            "n_stable": self.n_stable,
            "p95_canary": self.p95_canary,
            "p95_stable": self.p95_stable,
            "ratio": self.ratio,
            "delta_ms": self.delta_ms,
            "tail_share_canary": self.tail_share_canary,
            "tail_share_stable": self.tail_share_stable,
            "tail_z": self.tail_z,
            "tail_p": self.tail_p,
            "naive_p95_canary": self.naive_p95_canary,
            "naive_ratio": self.naive_ratio,
            "naive_verdict": self.naive_verdict or "",
            "mix_adjusted": self.mix_adjusted,
            "mix_coverage": self.mix_coverage,
            "drivers": list(self.drivers),
            "explanation": self.explanation,
            "span_windows": self.span_windows,
        }


@dataclass(frozen=True, slots=True)
class RuleEvaluation:
    """What one rule concluded for one series in one window: a row of ``rule_evaluations``.

    ``span_windows``: the windows the rule looked at (the grown span for regression and canary rules).
    ``samples``: what its sample gate counted (regression: the short span; canary: the smaller arm).
    ``last_decided_at``: the latest window (this one included) in which this series' outcome decided
    something (:data:`DECIDED_OUTCOMES`), ``None`` if it never could.
    """

    rule: str
    tenant: str
    stage: str
    version: str
    outcome: Outcome
    window_start: float = 0.0
    span_windows: int = 0
    samples: int = 0
    last_decided_at: float | None = None

    @property
    def key(self) -> str:
        """The series: ``tenant|rule|stage|version`` (the ``ttft.rule-evaluations`` message key)."""
        return f"{self.tenant}|{self.rule}|{self.stage}|{self.version}"

    def to_row(self) -> dict[str, Any]:
        """Column values for the ``rule_evaluations`` table (migration 0009)."""
        return {
            "window_start": ms_to_datetime(self.window_start),
            "tenant_id": self.tenant,
            "rule": self.rule,
            "stage": self.stage,
            "version_id": self.version,
            "outcome": self.outcome,
            "span_windows": self.span_windows,
            "samples": self.samples,
            "last_decided_at": ms_to_datetime(self.last_decided_at),
        }

    def to_message(self) -> dict[str, Any]:
        """JSON-ready value for the ``ttft.rule-evaluations`` topic (key: :attr:`key`)."""
        return {
            "rule": self.rule,
            "tenant": self.tenant,
            "stage": self.stage,
            "version": self.version,
            "outcome": self.outcome,
            "window_start": self.window_start,
            "span_windows": self.span_windows,
            "samples": self.samples,
            "last_decided_at": self.last_decided_at,
        }

    @classmethod
    def from_message(cls, data: Mapping[str, Any]) -> RuleEvaluation:
        """Inverse of :meth:`to_message`; raises ``KeyError``/``ValueError``/``TypeError`` when malformed."""
        last = data.get("last_decided_at")
        return cls(
            rule=str(data["rule"]),
            tenant=str(data["tenant"]),
            stage=str(data["stage"]),
            version=str(data["version"]),
            outcome=data["outcome"],
            window_start=float(data["window_start"]),
            span_windows=int(data["span_windows"]),
            samples=int(data["samples"]),
            last_decided_at=None if last is None else float(last),
        )


RULE_EVALUATION_COLUMNS: tuple[str, ...] = tuple(RuleEvaluation("x", "", "", "", "ok").to_row().keys())


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """The closed window's rows, as produced by ``streams.core.windows`` (all rows share one window_start).

    ``arms`` maps ``(tenant_id, version_id)`` to ``stable``/``canary``; versions absent from it are
    neither (ignored by the canary rule, counted by the others).
    """

    stage_windows: list[dict[str, Any]] = field(default_factory=list)
    stage_strata: list[dict[str, Any]] = field(default_factory=list)
    window_health: list[dict[str, Any]] = field(default_factory=list)
    llm_signals: list[dict[str, Any]] = field(default_factory=list)
    arms: Mapping[tuple[str, str], Arm] = field(default_factory=dict)
    #: ``tail_attribution`` rows (:mod:`streams.core.attribution`): alerts' example requests, SLO burn's stage
    tail_attribution: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class WindowEvaluation:
    """Everything one window close produced: transitions to deliver and store, verdict rows, outcomes."""

    window_start: float
    transitions: list[AlertTransition] = field(default_factory=list)
    verdicts: list[CanaryVerdict] = field(default_factory=list)
    evaluations: list[RuleEvaluation] = field(default_factory=list)


def ingest_halted_transition(
    state: Literal["firing", "resolved"],
    at_ms: float,
    *,
    fired_at_ms: float | None = None,
    detail: str = "",
    numbers: Mapping[str, float] | None = None,
    runbook_base_url: str | None = None,
) -> AlertTransition:
    """TTFTIngestHalted, raised when ingestion is halted for everyone (the store refusing every call; see
    :mod:`streams.app.store_outage`) and resolved when it resumes. ``at_ms`` is when it fired (or cleared);
    pass the ``fired_at_ms`` of the firing transition when resolving, so both rows share one alert."""
    fired_at = at_ms if state == "firing" else fired_at_ms
    return AlertTransition(
        alertname="TTFTIngestHalted",
        labels={"alertname": "TTFTIngestHalted", "severity": "page"},
        annotations={
            "summary": "Ingestion halted: the store refuses every call" if state == "firing" else "Ingestion resumed",
            "description": detail or "the store has refused every call for caps.store_halt_page_s",
            "runbook_url": runbook_url(runbook_base_url, "TTFTIngestHalted"),
        },
        numbers={k: float(v) for k, v in (numbers or {}).items()},
        state=state,
        window_start=at_ms,
        active_at=fired_at if fired_at is not None else at_ms,
        fired_at=fired_at,
        resolved_at=at_ms if state == "resolved" else None,
    )
