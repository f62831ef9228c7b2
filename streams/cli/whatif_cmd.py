"""``ttft whatif``: the TTFT percentiles if a stage were faster, replayed over the stored complete requests.

Levers apply in the order they are given on the command line (``--scale A --cut B --scale C`` is three
levers in that order); click groups an option's repeats, so the order is read from the parser first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click
import orjson
from rich.console import Console

from streams.cli.breakdown_cmd import SPAN_HELP
from streams.cli.conventions import model_version, model_version_option
from streams.cli.span_reader import open_span
from streams.core.whatif import (
    DEFAULT_MIN_DONORS,
    DEFAULT_RESAMPLES,
    WhatIfRefused,
    predict,
)
from streams.core.whatif_levers import (
    LEVER_STAGES,
    AllCacheHits,
    Lever,
    LeverError,
    ParallelRecall,
    parse_cache_hits,
    parse_cached_share,
    parse_cap,
    parse_cut,
    parse_route,
    parse_route_share,
    parse_scale,
)
from streams.core.whatif_rank import rank_stages
from streams.settings import load_settings
from streams.views.reads import request_columns
from streams.views.whatif import Scope, render_rank, render_whatif

_ORDER_KEY = "ttft.whatif.lever_order"
#: Lever options (click parameter names) -> how one value becomes a lever.
_PARSERS: dict[str, Callable[[Any], Lever]] = {
    "scale": parse_scale,
    "cut": parse_cut,
    "cap": parse_cap,
    "parallel_recall": lambda _flag: ParallelRecall(),
    "all_cache_hits": lambda _flag: AllCacheHits(),
    "cache_hits": parse_cache_hits,
    "cached_share": parse_cached_share,
    "route_all": parse_route,
    "route_share": parse_route_share,
}
_STAGES = ", ".join(LEVER_STAGES)


class _OrderedLevers(click.Command):
    """Records the order of the lever options as given (click hands each option's values over grouped)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        except click.UsageError:
            order = []  # the real parse below reports it
        ctx.meta[_ORDER_KEY] = [p.name for p in order if p.name in _PARSERS]
        return super().parse_args(ctx, args)


def ordered_levers(order: Sequence[str], values: dict[str, Any]) -> list[Lever]:
    """The levers in command-line order: ``order`` names an option per occurrence, ``values`` holds each
    option's values (a tuple for repeatable ones, a bool for flags). A flag counts once, where it first
    appears. Raises :class:`LeverError`."""
    queues = {name: list(v) if isinstance(v, tuple) else ([v] if v else []) for name, v in values.items()}
    levers: list[Lever] = []
    for name in order:
        if queues.get(name):
            levers.append(_PARSERS[name](queues[name].pop(0)))
    for name, rest in queues.items():  # values the order did not account for (not given on a command line)
        levers += [_PARSERS[name](value) for value in rest]
    return levers


@click.command(cls=_OrderedLevers)
@click.option("--tenant", default=None, help="Tenant id (default: all tenants together).")
@model_version_option("One model/prompt version (default: all versions).")
@click.option("--route", default=None, help="Only requests served on this route (default: all routes).")
@click.option("--since", default="1h", show_default=True, help=f"Span start: {SPAN_HELP}.")
@click.option("--until", default=None, help=f"Span end (default: the anchor): {SPAN_HELP}.")
@click.option(
    "--anchor",
    type=click.Choice(["data", "now"]),
    default="data",
    show_default=True,
    help="What relative times count back from: the newest stored window, or the wall clock.",
)
@click.option("--scale", multiple=True, metavar="STAGE=F", help=f"The stage takes F times as long; STAGE: {_STAGES}.")
@click.option("--cut", multiple=True, metavar="STAGE=MS", help="MS milliseconds off the stage, floored at 0.")
@click.option("--cap", multiple=True, metavar="STAGE=MS|pNN", help="At most MS, or at most the stage's own pNN.")
@click.option("--parallel-recall", is_flag=True, help="Serial recall in parallel: retrieval loses its shorter leg.")
@click.option("--all-cache-hits", is_flag=True, help="Prompt-cache misses take a hit's llm_ttft (same prompt size).")
@click.option(
    "--cache-hits",
    default=None,
    metavar="SHARE",
    help="Like --all-cache-hits, until SHARE (0-1) of the cacheable prompts hit (stored hits count toward it).",
)
@click.option(
    "--cached-share",
    default=None,
    metavar="S",
    help="Every prompt-cache hit (so far) caches S (0-1) of its prompt: its prefill rescaled by the fitted "
    "llm_ttft-over-uncached-tokens line (after --all-cache-hits: the hits it made too).",
)
@click.option("--route-all", default=None, metavar="ROUTE", help="Every request takes the llm_ttft of one on ROUTE.")
@click.option(
    "--route-share",
    multiple=True,
    metavar="ROUTE=SHARE:F",
    help="SHARE (0-1) of the requests on ROUTE, whose llm_ttft takes F times as long (a route without traffic).",
)
@click.option("--rank", is_flag=True, help="Rank every stage by its effect on TTFT P95 (20 % faster, capped at P50).")
@click.option(
    "--resamples",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_RESAMPLES,
    show_default=True,
    help="Bootstrap resamples of the requests for the predicted P95's interval.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the donor draws and the bootstrap.")
@click.option(
    "--min-donors",
    type=click.IntRange(1),
    default=DEFAULT_MIN_DONORS,
    show_default=True,
    help="Donors a prompt-size bucket needs for --all-cache-hits / --route-all.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON (milliseconds).")
@click.pass_context
def whatif(
    ctx: click.Context,
    /,
    tenant: str | None,
    version: str | None,
    old_version: str | None,
    route: str | None,
    since: str,
    until: str | None,
    anchor: str,
    rank: bool,
    resamples: int,
    seed: int,
    min_donors: int,
    as_json: bool,
    **lever_values: Any,
) -> None:
    """What TTFT's P50/P95/P99 would be with the given levers, replayed request by request over the stored
    complete requests (levers apply in the order given; sub-stages roll up into retrieval), with the
    predicted P95's bootstrap interval and the stage-P95 estimate beside it. --rank: which stage to cut first.
    """
    version = model_version(version, old_version)
    try:
        levers = ordered_levers(ctx.meta.get(_ORDER_KEY, []), lever_values)
    except LeverError as exc:
        raise click.BadParameter(str(exc)) from None
    if rank and levers:
        raise click.UsageError("--rank replays each stage on its own: give it no levers")
    if not rank and not levers:
        raise click.UsageError(
            "name a lever (--scale, --cut, --cap, --parallel-recall, --all-cache-hits, --cache-hits, --cached-share, "
            "--route-all, --route-share) or --rank"
        )
    settings = load_settings()
    client, database, span = open_span(settings, "requests", since, until, anchor, tenant)
    columns = request_columns(client, database, span, tenant, version, route)
    scope = Scope(tenant, version, route, span)
    try:
        if rank:
            ranking = rank_stages(columns, resamples=resamples, seed=seed)
            if as_json:
                return _echo_json(ranking.to_json())
            return render_rank(Console(), scope, ranking)
        result = predict(
            columns,
            levers,
            resamples=resamples,
            seed=seed,
            min_donors=min_donors,
            cacheable_min_tokens=settings.windows.cacheable_min_tokens,
        )
    except WhatIfRefused as exc:
        raise click.ClickException(f"{exc} ({scope.span_line()})") from None
    if as_json:
        return _echo_json(result.to_json())
    render_whatif(Console(), scope, result, resamples)


def _echo_json(payload: dict[str, Any]) -> None:
    click.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode())
