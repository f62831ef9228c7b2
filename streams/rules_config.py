"""Validated alert-rule settings (the ``rules`` section of ``TTFT_CONFIG``).

Every span is a count of event-time windows (``windows.window_s``, 60 s by default), so the same rules run
in tests, replays and production. The defaults below equal ``deploy/config/ttft.yaml``; per-tenant SLOs and
stage floors live in the ``tenants`` section of the settings (:class:`streams.settings.TenantConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Severity = Literal["page", "ticket"]

#: Absolute P95 increase (ms) below which a ratio is not a regression: cheap stages double harmlessly.
DEFAULT_STAGE_FLOOR_MS: dict[str, float] = {
    "retrieval": 20.0,
    "vector_recall": 20.0,
    "bm25_recall": 20.0,
    "rerank": 20.0,
    "prompt_assemble": 5.0,
    "llm_ttft": 100.0,
    "ttft": 100.0,
    "other": 20.0,
}


class _Rule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True


class StageRegressionRule(_Rule):
    """TTFTStageRegression: a tenant's parent-stage P95 against its own trailing baseline.

    Spans grow to the evidence: the short span is the smallest run of recent windows, from
    ``short_windows`` up to ``max_span_windows``, holding ``min_recent_samples``; the long span keeps its
    lead over it (``long_windows - short_windows`` more windows, capped at ``max_span_windows``), and the
    baseline ends before the long span begins. Even the largest span short of samples is
    ``insufficient_traffic``. Breach when ``min(ratio_short, ratio_long) >= ratio`` and the short-span P95
    exceeds the baseline by the stage floor; firing after ``for_windows`` breaching windows; resolved after
    ``resolve_windows`` windows with the short ratio below ``recovery_ratio`` (hysteresis). Canary-arm
    traffic is left out: canaries have their own rule.
    """

    stages: tuple[str, ...] = ("retrieval", "prompt_assemble", "llm_ttft")
    short_windows: int = Field(1, gt=0, description="Shortest short span, ending with the closing window.")
    long_windows: int = Field(5, gt=0, description="Shortest long span, ending with the closing window.")
    max_span_windows: int = Field(30, gt=0, description="Largest span the short and long spans grow to.")
    baseline_windows: int = Field(60, gt=0, description="Trailing baseline length.")
    exclude_recent_windows: int = Field(5, ge=0, description="Recent windows kept out of the baseline.")
    min_recent_samples: int = Field(400, gt=0, description="Samples needed in the short span.")
    min_baseline_samples: int = Field(1_000, gt=0)
    ratio: float = Field(1.25, gt=1.0)
    page_ratio: float = Field(1.4, gt=1.0, description="Short-span ratio at pending time that makes it a page.")
    recovery_ratio: float = Field(1.10, gt=0.0)
    for_windows: int = Field(2, gt=0)
    resolve_windows: int = Field(1, gt=0)

    @model_validator(mode="after")
    def _check(self) -> StageRegressionRule:
        if self.recovery_ratio >= self.ratio:
            raise ValueError("recovery_ratio must be below ratio (hysteresis)")
        if self.page_ratio < self.ratio:
            raise ValueError("page_ratio must be at least ratio")
        if self.short_windows > self.long_windows:
            raise ValueError("short_windows must not exceed long_windows")
        if self.exclude_recent_windows < self.long_windows:
            raise ValueError("exclude_recent_windows must cover long_windows, or the baseline absorbs the change")
        if self.max_span_windows < self.long_windows:
            raise ValueError("max_span_windows must be at least long_windows")
        return self

    def history_windows(self) -> int:
        """Windows of history a series needs: the baseline behind the largest span it may use."""
        return self.baseline_windows + max(self.exclude_recent_windows, self.max_span_windows)


class CanaryRule(_Rule):
    """TTFTCanaryFailed: canary vs stable arm per tenant x stage over the same trailing windows.

    The span is cumulative (Kayenta-style): the smallest run of recent windows, at least ``span_windows``,
    in which both arms hold ``min_samples``; it grows over the canary's lifetime up to
    ``max_span_windows`` and never reaches before the canary's first window. The stable arm counts only
    windows in which the canary had traffic too. Gates in order: sample gate (``insufficient_traffic``, never
    a pass), absolute SLO gate on the canary's TTFT
    P95, critical ratio (fails at once), relative gate (ratio, floor and a one-sided tail test). P95s come
    from the stratum-reweighted canary sketch against the stable sketch. A failed canary stays failed (a
    pass does not resolve it) until its version has had no traffic for ``RulesConfig.stale_windows``.
    """

    stages: tuple[str, ...] = ("retrieval", "prompt_assemble", "llm_ttft", "ttft")
    span_windows: int = Field(5, gt=0, description="Shortest span.")
    max_span_windows: int = Field(60, gt=0, description="Largest span (cumulative from the canary's start).")
    min_samples: int = Field(1_000, gt=0, description="Per arm, over the span.")
    ratio: float = Field(1.10, gt=1.0)
    critical_ratio: float = Field(1.5, gt=1.0)
    alpha: float = Field(0.01, gt=0.0, lt=0.5, description="One-sided tail test significance.")
    tail_quantile: float = Field(0.95, gt=0.5, lt=1.0)
    for_windows: int = Field(2, gt=0, description="Failing verdicts in a row before firing.")
    mix_adjust: bool = True
    min_stratum_samples: int = Field(20, gt=0, description="Canary samples for a stratum to be reweighted.")
    min_mix_coverage: float = Field(
        0.8, gt=0.0, le=1.0, description="Stable share in reweightable strata needed to mix-adjust."
    )

    @model_validator(mode="after")
    def _check(self) -> CanaryRule:
        if self.critical_ratio <= self.ratio:
            raise ValueError("critical_ratio must be above ratio")
        if self.max_span_windows < self.span_windows:
            raise ValueError("max_span_windows must be at least span_windows")
        return self


class DraftAcceptanceRule(_Rule):
    """TTFTDraftAcceptanceLow: speculative decoding below ~60 % acceptance is slower than none."""

    threshold: float = Field(0.6, gt=0.0, lt=1.0)
    recovery_threshold: float = Field(0.65, gt=0.0, le=1.0)
    min_samples: int = Field(50, gt=0)
    for_windows: int = Field(2, gt=0)

    @model_validator(mode="after")
    def _check(self) -> DraftAcceptanceRule:
        if self.recovery_threshold < self.threshold:
            raise ValueError("recovery_threshold must be at least threshold")
        return self


class BurnWindowPair(BaseModel):
    """A multi-window burn-rate condition: both spans must burn faster than ``burn_rate``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    long_windows: int = Field(gt=0)
    short_windows: int = Field(gt=0)
    burn_rate: float = Field(gt=0.0)
    severity: Severity = "page"

    @model_validator(mode="after")
    def _check(self) -> BurnWindowPair:
        if self.short_windows >= self.long_windows:
            raise ValueError("short_windows must be below long_windows")
        return self


class SLOBurnRule(_Rule):
    """TTFTSLOBurn per tenant: SLI good = TTFT within the tenant SLO; timed-out and orphans are bad.

    Defaults are the SRE-workbook pairs for W = 60 s: 1 h & 5 m at 14.4, 6 h & 30 m at 6.
    """

    pairs: tuple[BurnWindowPair, ...] = (
        BurnWindowPair(long_windows=60, short_windows=5, burn_rate=14.4),
        BurnWindowPair(long_windows=360, short_windows=30, burn_rate=6.0),
    )
    min_long_events: int = Field(100, gt=0, description="Requests in the long span needed to judge a pair.")

    @model_validator(mode="after")
    def _check(self) -> SLOBurnRule:
        if not self.pairs:
            raise ValueError("at least one burn-rate window pair is required")
        return self


class TelemetryRule(_Rule):
    """TTFTTelemetryDegraded: a tenant window whose complete share is below the floor."""

    completeness_floor: float = Field(0.9, gt=0.0, le=1.0)
    min_requests: int = Field(50, gt=0, description="Smaller windows are not judged.")
    resolve_windows: int = Field(2, gt=0)


class TenantSilenceRule(_Rule):
    """TTFTTenantSilent: a tenant seen before with no records for ``silent_windows``."""

    silent_windows: int = Field(5, gt=0)
    forget_windows: int = Field(1_440, gt=0, description="Silent this long: forgotten (alert resolved).")

    @model_validator(mode="after")
    def _check(self) -> TenantSilenceRule:
        if self.forget_windows <= self.silent_windows:
            raise ValueError("forget_windows must exceed silent_windows")
        return self


class UndecidableRule(_Rule):
    """TTFTRuleUndecidable (ticket, never a page): a tenant with a regression or canary series that has been
    ``insufficient_traffic`` for ``after_windows`` evaluations in a row: its silence does not mean "fine"."""

    after_windows: int = Field(60, gt=0, description="Evaluations in a row without samples enough to decide.")


class RulesConfig(BaseModel):
    """All alert rules, and where their alerts lead (``runbook_base_url``, ``grafana_url``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runbook_base_url: str | None = Field(
        None,
        description=(
            "Where this deployment serves docs/runbook.md (https://..., or file:///... for one host); each alert's "
            "runbook_url is it + #<alertname in lower case>. Unset: the repository path docs/runbook.md#<alert>. "
            "ttft config check refuses a placeholder (an example host, the old repository URL)."
        ),
    )
    grafana_url: str | None = Field(
        None,
        description=(
            "Grafana's root URL (e.g. http://localhost:3000, Grafana's own default): alerts link to their board "
            "there (dashboard_url, Alertmanager's generatorURL). Unset: links are paths (/d/<uid>?...)."
        ),
    )
    stage_floor_ms: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_STAGE_FLOOR_MS),
        description="Per stage; a tenant's tenants.<id>.stage_floor_ms overrides it.",
    )
    stale_windows: int = Field(10, gt=0, description="An alert whose series has had no data this long resolves.")
    stage_regression: StageRegressionRule = StageRegressionRule()
    canary: CanaryRule = CanaryRule()
    draft_acceptance: DraftAcceptanceRule = DraftAcceptanceRule()
    slo_burn: SLOBurnRule = SLOBurnRule()
    telemetry: TelemetryRule = TelemetryRule()
    tenant_silence: TenantSilenceRule = TenantSilenceRule()
    undecidable: UndecidableRule = UndecidableRule()
    watchdog: bool = True

    @model_validator(mode="after")
    def _check(self) -> RulesConfig:
        for stage, floor in self.stage_floor_ms.items():
            if floor < 0:
                raise ValueError(f"stage_floor_ms.{stage} must be >= 0")
        return self

    def history_windows(self) -> int:
        """How many trailing windows the engine must keep for these rules."""
        return max(
            self.stage_regression.history_windows(),
            self.canary.max_span_windows,
            max(p.long_windows for p in self.slo_burn.pairs),
        )


def rules_config(raw: RulesConfig | Mapping[str, Any] | None) -> RulesConfig:
    """``Settings.rules`` as a :class:`RulesConfig` (it is a plain mapping until settings types it)."""
    if isinstance(raw, RulesConfig):
        return raw
    return RulesConfig.model_validate(dict(raw or {}))
