from __future__ import annotations

import click
import pytest

from streams.cli.whatif_cmd import _ORDER_KEY, ordered_levers, whatif
from streams.core.whatif_levers import Cut, ParallelRecall, Scale


def test_ordered_levers_follow_the_command_line() -> None:
    values = {
        "scale": ("llm_ttft=0.5", "rerank=0.5"),
        "cut": ("llm_ttft=100",),
        "cap": (),
        "parallel_recall": True,
        "all_cache_hits": False,
        "route_all": None,
    }
    order = ["scale", "parallel_recall", "cut", "scale", "parallel_recall"]
    assert ordered_levers(order, values) == [
        Scale("llm_ttft", 0.5),
        ParallelRecall(),
        Cut("llm_ttft", 100.0),
        Scale("rerank", 0.5),
    ]


def test_the_command_records_the_order_of_interleaved_options() -> None:
    args = ["--cut", "llm_ttft=100", "--scale", "llm_ttft=0.5", "--parallel-recall", "--cut", "rerank=1"]
    ctx = whatif.make_context("whatif", args)
    assert ctx.meta[_ORDER_KEY] == ["cut", "scale", "parallel_recall", "cut"]
    levers = ordered_levers(ctx.meta[_ORDER_KEY], {k: v for k, v in ctx.params.items() if k in _LEVER_PARAMS})
    assert [lever.text for lever in levers] == [
        "--cut llm_ttft=100",
        "--scale llm_ttft=0.5",
        "--parallel-recall",
        "--cut rerank=1",
    ]
    with pytest.raises(click.UsageError):
        whatif.make_context("whatif", ["--no-such-option"])


_LEVER_PARAMS = {"scale", "cut", "cap", "parallel_recall", "all_cache_hits", "route_all", "route_share"}


def test_route_share_is_a_lever_in_command_line_order() -> None:
    args = ["--route-share", "fast=0.58:0.4", "--scale", "llm_ttft=0.84"]
    ctx = whatif.make_context("whatif", args)
    levers = ordered_levers(ctx.meta[_ORDER_KEY], {k: v for k, v in ctx.params.items() if k in _LEVER_PARAMS})
    assert [lever.text for lever in levers] == ["--route-share fast=0.58:0.4", "--scale llm_ttft=0.84"]
