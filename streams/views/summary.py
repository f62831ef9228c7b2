"""Pure folds shared by ``ttft breakdown``, ``ttft report`` and ``ttft top``: stored rows -> span summaries.

Inputs are rows shaped like the aggregate tables (from SQL, or decoded from the ``ttft.stage-windows`` /
``ttft.window-health`` topics). Rules:

- stage percentiles over a span come from bins merged with :class:`streams.core.rollup.SketchRollup`;
- completeness and cache-hit shares are ratios of summed counts, never averages of per-window shares;
- tail shares are combined across windows weighted by each window's tail / band request count, exactly as
  :func:`streams.core.attribution.advice` does, so the displayed numbers and the advice agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from schemas.vocabulary import PARENT_STAGES, SUB_STAGE_PARENT
from streams.core.attribution import EXEMPLARS, OK, SHARE_STAGES
from streams.core.rollup import SketchRollup, rollup_rows
from streams.core.stages import OTHER, TTFT

#: Sub-stages belong to a parent: they are parts of its time, never extra time.
HEALTH_COUNTS: Final = (
    "total",
    "complete",
    "missing_stage",
    "no_first_chunk",
    "timed_out",
    "orphan",
    "late_events",
    "late_amendments",
    "amendments",
    "dead_letters",
    "duplicate_events",
    "overflow_series",
)


def stage_kind(stage: str) -> str:
    """``parent``, ``sub`` (part of retrieval), ``gap`` (``other``), ``ttft`` or ``custom``."""
    if stage in PARENT_STAGES:
        return "parent"
    if stage in SUB_STAGE_PARENT:
        return "sub"
    if stage == OTHER:
        return "gap"
    return "ttft" if stage == TTFT else "custom"


@dataclass(frozen=True, slots=True)
class StageStat:
    """One stage over a span: merged-sketch percentiles (ms), exact count and max."""

    stage: str
    kind: str
    parent: str | None
    count: int
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None
    windows: int
    negative_count: int = 0
    slo_bad_count: int = 0

    @classmethod
    def of(cls, stage: str, rollup: SketchRollup, windows: int | None = None) -> StageStat:
        """From a merged sketch; ``windows`` is the number of stored window rows behind it."""
        return cls(
            stage=stage,
            kind=stage_kind(stage),
            parent=SUB_STAGE_PARENT.get(stage),
            count=rollup.count,
            p50=rollup.quantile(0.5),
            p90=rollup.quantile(0.9),
            p95=rollup.quantile(0.95),
            p99=rollup.quantile(0.99),
            max=rollup.max,
            windows=rollup.windows if windows is None else windows,
            negative_count=rollup.negative_count,
            slo_bad_count=rollup.slo_bad_count,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def stage_stats(rows: Iterable[Mapping[str, Any]]) -> dict[str, StageStat]:
    """Merge ``stage_windows``-shaped rows (any tenants, versions, windows) per stage.

    Rows pre-merged in SQL carry ``windows`` (how many stored rows each stands for); others count as one.
    """
    rows = list(rows)
    windows: dict[str, int] = {}
    for row in rows:
        windows[row["stage"]] = windows.get(row["stage"], 0) + int(row.get("windows") or 1)
    merged = rollup_rows(rows, group_by=("stage",))
    return {key[0]: StageStat.of(key[0], r, windows[key[0]]) for key, r in merged.items()}


def _p95_key(stat: StageStat) -> tuple[float, str]:
    return (-(stat.p95 or 0.0), stat.stage)


def ordered_stages(stats: Mapping[str, StageStat]) -> list[StageStat]:
    """The stage table: parents by P95 (largest first), each followed by its sub-stages by P95, then the
    unattributed gap ``other``, then custom stages by P95. ``ttft`` is not a stage and is left out."""
    out: list[StageStat] = []
    for parent in sorted((s for s in stats.values() if s.kind == "parent"), key=_p95_key):
        out.append(parent)
        out.extend(sorted((s for s in stats.values() if s.parent == parent.stage), key=_p95_key))
    if OTHER in stats:
        out.append(stats[OTHER])
    out.extend(sorted((s for s in stats.values() if s.kind == "custom"), key=_p95_key))
    return out


def parent_p95_sum(stats: Mapping[str, StageStat]) -> float | None:
    """Sum of the parent stages' P95s: NOT the TTFT P95 (the slowest requests of each stage differ)."""
    values = [stats[s].p95 for s in PARENT_STAGES if s in stats and stats[s].p95 is not None]
    return sum(v for v in values if v is not None) if values else None


@dataclass(frozen=True, slots=True)
class TailSummary:
    """Tail attribution over a span: shares of TTFT in the slowest 5 % vs the 40-60th percentile band."""

    windows_ok: int = 0
    windows_insufficient: int = 0
    tail_count: int = 0
    band_count: int = 0
    biggest_p95_stage: str = ""
    tail_dominant_stage: str = ""
    tail_share: dict[str, float] = field(default_factory=dict)
    band_share: dict[str, float] = field(default_factory=dict)
    share_delta: dict[str, float] = field(default_factory=dict)
    exemplars: list[tuple[str, float | None]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["exemplars"] = [{"request_id": rid, "ttft_ms": ttft} for rid, ttft in self.exemplars]
        return data


def _weighted(rows: Sequence[Mapping[str, Any]], shares: str, weight: str) -> dict[str, float]:
    total = sum(int(r[weight]) for r in rows)
    if total == 0:
        return {}
    return {
        stage: sum(float(dict(r[shares]).get(stage, 0.0)) * int(r[weight]) for r in rows) / total
        for stage in SHARE_STAGES
    }


def _argmax(values: Mapping[str, float], order: Sequence[str]) -> str:
    candidates = [s for s in order if s in values]
    return max(candidates, key=lambda s: (values[s], -order.index(s))) if candidates else ""


def ok_attributions(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The attribution rows with enough data (status ``ok``)."""
    return [r for r in rows if r.get("status") == OK]


def combine_attribution(
    rows: Sequence[Mapping[str, Any]],
    stage_p95: Mapping[str, float | None],
    exemplar_ttft: Mapping[str, float | None] | None = None,
) -> TailSummary:
    """Combine per-window ``tail_attribution`` rows over a span.

    ``biggest_p95_stage`` comes from ``stage_p95`` (merged-bin P95s of the span), ``tail_dominant_stage``
    from the combined share deltas. Exemplars are the span's slowest requests: ranked by their stored TTFT
    when ``exemplar_ttft`` knows it, else by their window's TTFT P95.
    """
    ok = ok_attributions(rows)
    p95 = {s: float(v) for s, v in stage_p95.items() if s in PARENT_STAGES and v is not None}
    tail, band = _weighted(ok, "tail_share", "tail_count"), _weighted(ok, "band_share", "band_count")
    delta = {s: tail[s] - band.get(s, 0.0) for s in tail}
    known = exemplar_ttft or {}
    candidates: dict[str, tuple[float, float]] = {}
    for row in ok:
        for rank, rid in enumerate(row.get("exemplar_request_ids") or ()):
            ttft = known.get(rid)
            key = (ttft if ttft is not None else float(row.get("ttft_p95") or 0.0), -rank)
            candidates[rid] = max(candidates.get(rid, key), key)
    slowest = sorted(candidates, key=lambda rid: (-candidates[rid][0], -candidates[rid][1], rid))[:EXEMPLARS]
    return TailSummary(
        windows_ok=len(ok),
        windows_insufficient=sum(1 for r in rows if r.get("status") != OK),
        tail_count=sum(int(r["tail_count"]) for r in ok),
        band_count=sum(int(r["band_count"]) for r in ok),
        biggest_p95_stage=_argmax(p95, PARENT_STAGES),
        tail_dominant_stage=_argmax(delta, PARENT_STAGES),
        tail_share=tail,
        band_share=band,
        share_delta=delta,
        exemplars=[(rid, known.get(rid)) for rid in slowest],
    )


@dataclass(frozen=True, slots=True)
class Completeness:
    """Record status counts and data-quality counters summed over a span (``window_health``).

    ``no_first_chunk``: requests answered whose telemetry tells no first chunk (an OTLP LLM span without
    one): their TTFT is unknown, so they are neither SLO-good nor SLO-bad (:attr:`slo_total`)."""

    total: int = 0
    complete: int = 0
    missing_stage: int = 0
    no_first_chunk: int = 0
    timed_out: int = 0
    orphan: int = 0
    late_events: int = 0
    late_amendments: int = 0
    amendments: int = 0
    dead_letters: int = 0
    duplicate_events: int = 0
    overflow_series: int = 0

    def share(self, status: str) -> float | None:
        """Share of ``status`` among all records (``None`` without records)."""
        return int(getattr(self, status)) / self.total if self.total else None

    @property
    def slo_total(self) -> int:
        """The SLO's request total: every record but the ``no_first_chunk`` ones (TTFT unknown)."""
        return self.total - self.no_first_chunk

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = asdict(self)
        for status in ("complete", "missing_stage", "no_first_chunk", "timed_out", "orphan"):
            data[f"{status}_share"] = self.share(status)
        return data


def sum_health(rows: Iterable[Mapping[str, Any]]) -> Completeness:
    """Add up ``window_health``-shaped rows."""
    totals = dict.fromkeys(HEALTH_COUNTS, 0)
    for row in rows:
        for name in HEALTH_COUNTS:
            totals[name] += int(row.get(name) or 0)
    return Completeness(**totals)


@dataclass(frozen=True, slots=True)
class LlmSignals:
    """LLM lever signals over a span: cache hit rate from summed counts, draft acceptance per version."""

    requests: int = 0
    prompt_cache_known: int = 0
    prompt_cache_hits: int = 0
    prompt_tokens_known: int = 0
    below_cacheable: int = 0
    #: version -> (P50, P10, window start ms) of the newest window with draft data: percentiles of
    #: different windows cannot be merged without a sketch, so the newest is shown as is.
    draft_accept: dict[str, tuple[float | None, float | None, float]] = field(default_factory=dict)
    route_mix: dict[str, int] = field(default_factory=dict)
    fallback_mix: dict[str, int] = field(default_factory=dict)
    recall_mode_mix: dict[str, int] = field(default_factory=dict)

    @property
    def prompt_cache_hit_rate(self) -> float | None:
        return self.prompt_cache_hits / self.prompt_cache_known if self.prompt_cache_known else None

    @property
    def below_cacheable_share(self) -> float | None:
        return self.below_cacheable / self.prompt_tokens_known if self.prompt_tokens_known else None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = asdict(self)
        data["draft_accept"] = {
            v: {"p50": p50, "p10": p10, "window_start": ws} for v, (p50, p10, ws) in self.draft_accept.items()
        }
        data["prompt_cache_hit_rate"] = self.prompt_cache_hit_rate
        data["below_cacheable_share"] = self.below_cacheable_share
        return data


def _add_mix(into: dict[str, int], mix: Mapping[str, Any] | None) -> None:
    for key, n in (mix or {}).items():
        into[str(key)] = into.get(str(key), 0) + int(n)


def sum_signals(rows: Iterable[Mapping[str, Any]]) -> LlmSignals:
    """Add up ``llm_signals``-shaped rows (per window, or pre-summed with ``draft_window_start``)."""
    counts = dict.fromkeys(
        ("requests", "prompt_cache_known", "prompt_cache_hits", "prompt_tokens_known", "below_cacheable"), 0
    )
    draft: dict[str, tuple[float | None, float | None, float]] = {}
    mixes: dict[str, dict[str, int]] = {"route_mix": {}, "fallback_mix": {}, "recall_mode_mix": {}}
    for row in rows:
        for name in counts:
            counts[name] += int(row.get(name) or 0)
        for name, mix in mixes.items():
            _add_mix(mix, row.get(name))
        if int(row.get("draft_accept_count") or 0) > 0:
            at = float(row.get("draft_window_start") or row.get("window_start") or 0.0)
            version = str(row["version_id"])
            if version not in draft or at > draft[version][2]:
                draft[version] = (row.get("draft_accept_p50"), row.get("draft_accept_p10"), at)
    return LlmSignals(
        requests=counts["requests"],
        prompt_cache_known=counts["prompt_cache_known"],
        prompt_cache_hits=counts["prompt_cache_hits"],
        prompt_tokens_known=counts["prompt_tokens_known"],
        below_cacheable=counts["below_cacheable"],
        draft_accept=dict(sorted(draft.items())),
        route_mix=mixes["route_mix"],
        fallback_mix=mixes["fallback_mix"],
        recall_mode_mix=mixes["recall_mode_mix"],
    )


def fmt_ms(value: float | None) -> str:
    """Milliseconds for people: ``1,234 ms`` (``-`` when unknown)."""
    return "-" if value is None else f"{value:,.0f} ms"


def fmt_share(value: float | None, signed: bool = False) -> str:
    """A share as a percentage (``-`` when unknown)."""
    if value is None:
        return "-"
    return f"{100 * value:+.1f} pp" if signed else f"{100 * value:.1f} %"
