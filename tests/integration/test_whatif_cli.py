"""``ttft whatif`` end to end over the embedded store: a few thousand stored requests, the CLI's JSON parsed
and checked against numpy and against the pure replay of the same records."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from clickhouse_connect.driver.client import Client

from streams.core.whatif import RequestColumns, predict
from streams.core.whatif_levers import Cut, ParallelRecall
from streams.core.whatif_rank import rank_stages
from streams.core.windows import aggregate_windows
from streams.settings import Settings
from streams.store.aggregates_store import insert_window_aggregates
from streams.store.requests_store import insert_requests
from tests.support.recent import iso_utc
from tests.support.window_records import HOUR_START_MS, WINDOW_MS, synthetic_records

pytestmark = pytest.mark.clickhouse

WINDOWS = 10
SPAN_ARGS = ["--since", iso_utc(HOUR_START_MS), "--until", iso_utc(HOUR_START_MS + WINDOWS * WINDOW_MS)]


def _stored(client: Client, database: str) -> list[dict[str, Any]]:
    """3,000 records over 10 windows, half of the complete ones recalled serially, some without rerank; with
    the windows closed, so relative spans anchor on the newest window as ``ttft breakdown``'s do."""
    records = synthetic_records(3_000, span_ms=WINDOWS * WINDOW_MS, tenants=("acme", "globex"))
    for i, r in enumerate(records):
        if r["status"] != "complete":
            continue
        if i % 2:
            r["recall_mode"] = "serial"
            r["retrieval_ms"] = r["vector_recall_ms"] + r["bm25_recall_ms"] + r["rerank_ms"] + 1.0
            r["ttft_ms"] = r["retrieval_ms"] + r["prompt_assemble_ms"] + r["llm_ttft_ms"] + r["other_ms"]
            r["first_token_at"] = r["started_at"] + r["ttft_ms"]
        elif i % 7 == 0:
            r["rerank_ms"] = None
    insert_requests(client, database, records)
    for agg in aggregate_windows(records, Settings()).values():
        insert_window_aggregates(client, database, {"stage_windows": agg.stage_windows})
    return records


@dataclass
class StoredCli:
    """``ttft whatif`` over a test database, and the records stored in it."""

    records: list[dict[str, Any]]

    def __call__(self, *args: str) -> Result:
        from streams.cli.main import main

        return CliRunner().invoke(main, ["whatif", *args], terminal_width=140)


@pytest.fixture
def cli(ch_client: Client, ch_database: str, ch_session_path: Path, monkeypatch: pytest.MonkeyPatch) -> StoredCli:
    records = _stored(ch_client, ch_database)
    # The same chDB directory as the session client: make_client returns that process-wide client.
    monkeypatch.setenv("TTFT_CLICKHOUSE_URL", f"chdb://{ch_session_path}")
    monkeypatch.setenv("TTFT_CLICKHOUSE_DATABASE", ch_database)
    return StoredCli(records)


def _json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    payload: dict[str, Any] = json.loads(result.output)
    return payload


def test_whatif_json_matches_numpy_and_the_pure_replay(cli: StoredCli) -> None:
    records = cli.records
    complete = [r for r in records if r["status"] == "complete"]

    same = _json(cli("--json", "--scale", "retrieval=1", *SPAN_ARGS))
    ttft = np.array([r["ttft_ms"] for r in complete])
    assert same["requests"] == len(complete)
    want = {k: float(np.quantile(ttft, q, method="lower")) for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}
    assert same["observed"] == want
    assert {k: v for k, v in same["predicted"].items() if k != "p95_ci"} == want

    payload = _json(cli("--json", "--parallel-recall", "--cut", "rerank=20", "--seed", "4", *SPAN_ARGS))
    assert set(payload) == {"requests", "observed", "predicted", "naive_p95", "levers"}
    in_process = predict(RequestColumns.from_records(records), [ParallelRecall(), Cut("rerank", 20.0)], seed=4)
    assert payload == json.loads(json.dumps(in_process.to_json()))
    lo, hi = payload["predicted"]["p95_ci"]
    assert lo <= payload["predicted"]["p95"] <= hi < payload["observed"]["p95"]
    assert [lever["text"] for lever in payload["levers"]] == ["--parallel-recall", "--cut rerank=20"]
    assert payload["levers"][0]["changed"] == sum(1 for r in complete if r["recall_mode"] == "serial")


def test_whatif_filters_and_relative_spans(cli: StoredCli) -> None:
    records = cli.records
    acme_main = [r for r in records if r["status"] == "complete" and r["tenant_id"] == "acme" and r["route"] == "main"]
    payload = _json(cli("--json", "--tenant", "acme", "--route", "main", "--scale", "llm_ttft=0.8", *SPAN_ARGS))
    assert payload["requests"] == len(acme_main)
    v2 = _json(cli("--json", "--model-version", "v2", "--since", "5m", "--scale", "llm_ttft=0.8"))
    newest_end = HOUR_START_MS + WINDOWS * WINDOW_MS  # anchored on the newest stored window, not the clock
    assert v2["requests"] == sum(
        1
        for r in records
        if r["status"] == "complete" and r["version_id"] == "v2" and r["window_start"] >= newest_end - 5 * WINDOW_MS
    )


def test_whatif_levers_keep_the_command_line_order(cli: StoredCli) -> None:
    first = _json(cli("--json", "--cut", "llm_ttft=100", "--scale", "llm_ttft=0.5", *SPAN_ARGS))
    second = _json(cli("--json", "--scale", "llm_ttft=0.5", "--cut", "llm_ttft=100", *SPAN_ARGS))
    assert [lever["lever"] for lever in first["levers"]] == ["cut", "scale"]
    assert [lever["lever"] for lever in second["levers"]] == ["scale", "cut"]
    assert first["predicted"]["p95"] > second["predicted"]["p95"]


def test_whatif_donors_and_refusals(cli: StoredCli) -> None:
    hits = _json(cli("--json", "--all-cache-hits", *SPAN_ARGS))
    lever = hits["levers"][0]
    assert lever["lever"] == "all_cache_hits" and lever["donors"] > 0 and lever["changed"] > 0
    # The records' cache state is drawn apart from their latencies (hits are no faster than misses): with the
    # draws matched by rank, every miss a hit leaves TTFT's P95 where it was, give or take the draws.
    assert hits["predicted"]["p95"] == pytest.approx(hits["observed"]["p95"], rel=0.03)

    fast = _json(cli("--json", "--route-all", "fast", *SPAN_ARGS))
    assert fast["levers"][0]["route"] == "fast"
    shared = _json(cli("--json", "--route-share", "fast=0.9:0.4", *SPAN_ARGS))
    on_fast = sum(1 for r in cli.records if r["status"] == "complete" and r["route"] == "fast")
    assert shared["levers"][0]["already"] == on_fast
    assert shared["levers"][0]["changed"] == round(0.9 * shared["requests"]) - on_fast
    assert shared["predicted"]["p95"] < shared["observed"]["p95"]
    text = cli("--route-share", "fast=0.9:0.4", *SPAN_ARGS)
    words = " ".join(text.output.split())  # rich wraps at the console's width
    assert (
        text.exit_code == 0 and f"moved onto route fast ({on_fast:,} were on it already), their llm_ttft x0.4" in words
    )

    unknown = cli("--route-all", "turbo", *SPAN_ARGS)
    assert unknown.exit_code == 1 and "no replayed request was served on route 'turbo'" in unknown.output
    few = cli("--all-cache-hits", "--min-donors", "100000", *SPAN_ARGS)
    assert few.exit_code == 1 and "too few donors" in few.output and "--min-donors" in few.output
    empty = cli("--scale", "llm_ttft=0.5", "--tenant", "nobody", *SPAN_ARGS)
    assert empty.exit_code == 1 and "no complete requests" in empty.output
    bad = cli("--scale", "ttft=0.5", *SPAN_ARGS)
    assert bad.exit_code == 2 and "unknown stage 'ttft'" in bad.output
    nothing = cli(*SPAN_ARGS)
    assert nothing.exit_code == 2 and "name a lever" in nothing.output
    both = cli("--rank", "--scale", "llm_ttft=0.5", *SPAN_ARGS)
    assert both.exit_code == 2 and "--rank" in both.output


def test_whatif_rank_and_text_output(cli: StoredCli) -> None:
    records = cli.records
    ranked = _json(cli("--json", "--rank", "--resamples", "50", *SPAN_ARGS))
    in_process = rank_stages(RequestColumns.from_records(records), resamples=50)
    assert ranked == json.loads(json.dumps(in_process.to_json()))
    assert ranked["rank"][0]["stage"] == "llm_ttft"
    assert {row["stage"] for row in ranked["rank"]} == {
        "retrieval",
        "vector_recall",
        "bm25_recall",
        "rerank",
        "prompt_assemble",
        "llm_ttft",
    }

    text = cli("--rank", *SPAN_ARGS)
    assert text.exit_code == 0, text.output
    assert "What to cut first" in text.output and "cut llm_ttft first" in text.output

    text = cli("--scale", "retrieval=0.7", "--cap", "llm_ttft=p95", *SPAN_ARGS)
    assert text.exit_code == 0, text.output
    for words in ("What if", "--scale retrieval=0.7", "--cap llm_ttft=p95", "P95", "95 % CI", "naive"):
        assert words in text.output, words
    assert _json(cli("--json", "--scale", "retrieval=0.7", *SPAN_ARGS))["levers"][0] == {
        "lever": "scale",
        "text": "--scale retrieval=0.7",
        "stage": "retrieval",
        "factor": 0.7,
        "changed": sum(1 for r in records if r["status"] == "complete"),
    }


def test_the_store_read_leaves_out_the_versions_asked(cli: StoredCli, ch_client: Client, ch_database: str) -> None:
    from streams.store.request_columns import read_request_columns

    start, end = HOUR_START_MS, HOUR_START_MS + WINDOWS * WINDOW_MS
    complete = [r for r in cli.records if r["status"] == "complete" and r["tenant_id"] == "acme"]
    everything = read_request_columns(ch_client, ch_database, start, end, tenant="acme")
    stable = read_request_columns(ch_client, ch_database, start, end, tenant="acme", exclude_versions=["v2"])
    assert everything.n == len(complete)
    assert sorted(stable.ttft.tolist()) == sorted(r["ttft_ms"] for r in complete if r["version_id"] != "v2")
