"""The levers of ``ttft whatif``: one fix each, as it changes a request's stage durations.

A lever is plain data, parsed from its command-line form and printed back in it; what it does to the
stored requests is :mod:`streams.core.whatif`. The stages a lever may name are the three parents
(``retrieval``, ``prompt_assemble``, ``llm_ttft``) and the sub-stages of retrieval (``vector_recall``,
``bm25_recall``, ``rerank``). ``other`` (the unattributed gap) has no lever: it is kept as it is.

- ``Scale(stage, f)``: the stage takes ``f`` times as long (``--scale retrieval=0.7``; ``1.5`` is slower).
- ``Cut(stage, ms)``: ``ms`` milliseconds off, floored at 0 (``--cut rerank=40``).
- ``Cap(stage, ms)`` / ``Cap(stage, percentile=q)``: at most ``ms``, or at most the stage's own ``pNN``
  over the requests replayed (``--cap llm_ttft=1500``, ``--cap rerank=p50``).
- ``ParallelRecall()``: requests whose two recall legs ran one after the other run them side by side.
- ``AllCacheHits()``: prompt-cache misses take the LLM first-token time of a prompt-cache hit.
- ``CachedShare(share)``: every prompt-cache hit (so far) caches ``share`` of its prompt (``--cached-share
  0.75``): its prefill rescaled along the line of ``llm_ttft`` over uncached prompt tokens fitted on the
  replayed requests. For a fix that changes how much a hit caches (a stable prompt prefix), not only how
  often a prompt hits.
- ``RouteAll(route)``: every request takes the LLM first-token time of a request served on ``route``.
- ``RouteShare(route, share, factor)``: ``share`` of the requests are served on ``route``, whose LLM first
  token takes ``factor`` times as long (``--route-share fast=0.58:0.4``): a route no request takes yet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final

from schemas.vocabulary import PARENT_STAGES, SUB_STAGES

#: Stages a lever may name: parents first, then the sub-stages of retrieval.
LEVER_STAGES: Final[tuple[str, ...]] = (*PARENT_STAGES, *SUB_STAGES)
_NUMBER = r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+"
_PERCENTILE = re.compile(rf"[pP]({_NUMBER})")


class LeverError(ValueError):
    """A lever that cannot be read or applied as given (unknown stage, bad number, unknown route)."""


@dataclass(frozen=True, slots=True)
class Scale:
    """The stage takes ``factor`` times as long (a factor of 1 changes nothing)."""

    stage: str
    factor: float

    def __post_init__(self) -> None:
        _check(self.stage, self.factor, "a scale factor")

    @property
    def text(self) -> str:
        return f"--scale {self.stage}={self.factor:g}"


@dataclass(frozen=True, slots=True)
class Cut:
    """``ms`` milliseconds off the stage, floored at 0."""

    stage: str
    ms: float

    def __post_init__(self) -> None:
        _check(self.stage, self.ms, "a cut")

    @property
    def text(self) -> str:
        return f"--cut {self.stage}={self.ms:g}"


@dataclass(frozen=True, slots=True)
class Cap:
    """The stage takes at most ``ms``, or at most its own ``percentile`` (0-100) over the replayed requests."""

    stage: str
    ms: float | None = None
    percentile: float | None = None

    def __post_init__(self) -> None:
        if (self.ms is None) == (self.percentile is None):
            raise LeverError("a cap takes milliseconds or a percentile, not both")
        if self.percentile is not None and not 0.0 < self.percentile <= 100.0:
            raise LeverError(f"a cap's percentile lies in (0, 100], got {self.percentile:g}")
        _check(self.stage, self.ms if self.ms is not None else 0.0, "a cap")

    @property
    def text(self) -> str:
        value = f"p{self.percentile:g}" if self.percentile is not None else f"{self.ms:g}"
        return f"--cap {self.stage}={value}"


@dataclass(frozen=True, slots=True)
class ParallelRecall:
    """Serial recall becomes parallel: retrieval is shortened by the shorter recall leg."""

    @property
    def text(self) -> str:
        return "--parallel-recall"


@dataclass(frozen=True, slots=True)
class AllCacheHits:
    """Prompt-cache misses take the ``llm_ttft`` of a hit with a prompt of the same size bucket (draws
    matched by rank: the slowest miss takes the slowest draw). ``share`` < 1 (``--cache-hits 0.85``): only
    until that share of the cacheable prompts hit (the stored hits count toward it; the misses that turn
    into hits are drawn at random, seeded)."""

    share: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.share) and 0.0 <= self.share <= 1.0):
            raise LeverError(f"--cache-hits: a share lies in [0, 1], got {self.share!r}")

    @property
    def text(self) -> str:
        return "--all-cache-hits" if self.share == 1.0 else f"--cache-hits {self.share:g}"


@dataclass(frozen=True, slots=True)
class CachedShare:
    """Every prompt-cache hit caches ``share`` (0-1) of its prompt: its ``llm_ttft`` is rescaled along the
    fitted line ``a + b * uncached tokens`` from the uncached tokens it had to those it would have."""

    share: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.share) and 0.0 <= self.share <= 1.0):
            raise LeverError(f"--cached-share: a share lies in [0, 1], got {self.share!r}")

    @property
    def text(self) -> str:
        return f"--cached-share {self.share:g}"


@dataclass(frozen=True, slots=True)
class RouteAll:
    """Requests off ``route`` take the ``llm_ttft`` of a request on it with a prompt of the same size bucket."""

    route: str

    @property
    def text(self) -> str:
        return f"--route-all={self.route}"


@dataclass(frozen=True, slots=True)
class RouteShare:
    """``share`` (0-1) of the replayed requests end up served on ``route``, where ``llm_ttft`` takes ``factor``
    times as long. Requests already on it count toward the share; the others are drawn at random (seeded)
    from the requests off it. For a route that has no traffic to lend its times yet (``--route-all`` needs
    some): the factor is what a benchmark of the route's model says."""

    route: str
    share: float
    factor: float

    def __post_init__(self) -> None:
        if not self.route.strip():
            raise LeverError("--route-share takes a route name")
        if not (math.isfinite(self.share) and 0.0 <= self.share <= 1.0):
            raise LeverError(f"--route-share: a share lies in [0, 1], got {self.share!r}")
        if not (math.isfinite(self.factor) and self.factor >= 0.0):
            raise LeverError(f"--route-share: a factor must be a finite number >= 0, got {self.factor!r}")

    @property
    def text(self) -> str:
        return f"--route-share {self.route}={self.share:g}:{self.factor:g}"


def _check(stage: str, value: float, what: str) -> None:
    if stage not in LEVER_STAGES:
        raise LeverError(f"unknown stage {stage!r}; one of {', '.join(LEVER_STAGES)}")
    if not (math.isfinite(value) and value >= 0.0):
        raise LeverError(f"{what} of {stage} must be a finite number >= 0, got {value!r}")


Lever = Scale | Cut | Cap | ParallelRecall | AllCacheHits | CachedShare | RouteAll | RouteShare


def lever_kind(lever: Lever) -> str:
    """The lever's name in JSON: ``scale``, ``cut``, ``cap``, ``parallel_recall``, ``all_cache_hits``,
    ``cached_share``, ``route_all``, ``route_share``."""
    return {
        Scale: "scale",
        Cut: "cut",
        Cap: "cap",
        ParallelRecall: "parallel_recall",
        AllCacheHits: "all_cache_hits",
        CachedShare: "cached_share",
        RouteAll: "route_all",
        RouteShare: "route_share",
    }[type(lever)]


def lever_json(lever: Lever) -> dict[str, Any]:
    """What the lever is, JSON-ready: its kind, stage and value, and its command-line text."""
    out: dict[str, Any] = {"lever": lever_kind(lever), "text": lever.text}
    if isinstance(lever, Scale):
        out |= {"stage": lever.stage, "factor": lever.factor}
    elif isinstance(lever, Cut):
        out |= {"stage": lever.stage, "ms": lever.ms}
    elif isinstance(lever, Cap):
        out |= {"stage": lever.stage, "ms": lever.ms, "percentile": lever.percentile}
    elif isinstance(lever, ParallelRecall):
        out |= {"stage": "retrieval"}
    elif isinstance(lever, RouteShare):
        out |= {"stage": "llm_ttft", "route": lever.route, "share": lever.share, "factor": lever.factor}
    else:
        out |= {"stage": "llm_ttft"}
        if isinstance(lever, RouteAll):
            out["route"] = lever.route
        elif isinstance(lever, CachedShare | AllCacheHits):
            out["share"] = lever.share
    return out


def _stage_value(option: str, text: str) -> tuple[str, str]:
    stage, sep, value = text.partition("=")
    stage, value = stage.strip(), value.strip()
    if not sep or not stage or not value:
        raise LeverError(f"--{option} takes STAGE=VALUE, got {text!r}")
    if stage not in LEVER_STAGES:
        raise LeverError(f"--{option} {text!r}: unknown stage {stage!r}; one of {', '.join(LEVER_STAGES)}")
    return stage, value


def _number(option: str, text: str, value: str) -> float:
    if not re.fullmatch(_NUMBER, value):
        raise LeverError(f"--{option} {text!r}: {value!r} is not a number >= 0")
    number = float(value)
    if not math.isfinite(number):
        raise LeverError(f"--{option} {text!r}: {value!r} is not finite")
    return number


def parse_scale(text: str) -> Scale:
    """``STAGE=F`` (``retrieval=0.7``): F >= 0."""
    stage, value = _stage_value("scale", text)
    return Scale(stage, _number("scale", text, value))


def parse_cut(text: str) -> Cut:
    """``STAGE=N`` (``rerank=40``): N milliseconds >= 0."""
    stage, value = _stage_value("cut", text)
    return Cut(stage, _number("cut", text, value))


def parse_cap(text: str) -> Cap:
    """``STAGE=N`` (at most N ms) or ``STAGE=pNN`` (at most the stage's own NNth percentile, 0 < NN <= 100)."""
    stage, value = _stage_value("cap", text)
    match = _PERCENTILE.fullmatch(value)
    if match is None:
        return Cap(stage, ms=_number("cap", text, value))
    percentile = float(match.group(1))
    if not 0.0 < percentile <= 100.0:
        raise LeverError(f"--cap {text!r}: a percentile lies in (0, 100], got {value!r}")
    return Cap(stage, percentile=percentile)


def _share(option: str, text: str | float) -> float:
    try:
        return float(text)
    except ValueError:
        raise LeverError(f"{option} takes a share in [0, 1], got {text!r}") from None


def parse_cached_share(text: str | float) -> CachedShare:
    return CachedShare(_share("--cached-share", text))


def parse_cache_hits(text: str | float) -> AllCacheHits:
    return AllCacheHits(_share("--cache-hits", text))


def parse_route(route: str) -> RouteAll:
    """``--route-all=ROUTE``: a non-empty route name."""
    if not route.strip():
        raise LeverError("--route-all takes a route name")
    return RouteAll(route)


def parse_route_share(text: str) -> RouteShare:
    """``ROUTE=SHARE:FACTOR`` (``fast=0.58:0.4``): SHARE in [0, 1] of the requests on ROUTE, their llm_ttft
    times FACTOR (>= 0)."""
    route, sep, value = text.partition("=")
    share, colon, factor = value.partition(":")
    route, share, factor = route.strip(), share.strip(), factor.strip()
    if not sep or not colon or not route or not share or not factor:
        raise LeverError(f"--route-share takes ROUTE=SHARE:FACTOR, got {text!r}")
    return RouteShare(route, _number("route-share", text, share), _number("route-share", text, factor))
