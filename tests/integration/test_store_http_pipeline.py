"""While the real pipeline ingests, the store it fills is read through the writer's HTTP interface.

Broker, ``ttft worker --role writer`` and ``--role join`` subprocesses over the embedded store, traffic
produced in slices for ~20 s. Meanwhile ``ttft breakdown``, ``request``, ``report`` and ``rules status``
succeed (the first three through the writer's interface, found in its run file; ``rules status`` reads its
topic), clickhouse-connect and the Go driver run every dashboard query without an error, and a write
through the interface is refused. Once the traffic is drained, with the writer still running, both clients
get the same rows for every dashboard query.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import clickhouse_connect
import orjson
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from streams.ports import free_port
from tests.support.pipeline import REPO, Pipeline, group_lag, pipeline_env, produce_sync
from tests.support.store_http import canonical_rows, dashboard_queries, go_client, run_go
from tests.support.traffic import build_traffic

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.clickhouse, pytest.mark.timeout(420)]

REQUESTS = 8_000
#: The traffic goes out in this many slices, one a second, for as long as the checks run.
SLICES = 60


def _ttft(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli.main", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _until_ok(env: dict[str, str], *args: str, within_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``ttft args`` until it succeeds (the data it needs may still be on its way)."""
    deadline = time.monotonic() + within_s
    while True:
        out = _ttft(env, *args)
        if out.returncode == 0 or time.monotonic() > deadline:
            return out
        time.sleep(1.0)


def _run_file_names(home: Path, url: str) -> bool:
    for path in (home / "run").glob("writer-*.json"):
        try:
            if json.loads(path.read_text()).get("store_http") == url:
                return True
        except (OSError, ValueError):
            continue
    return False


def test_read_commands_and_clients_work_while_the_pipeline_ingests(kafka_settings: Any, tmp_path: Path) -> None:
    port = free_port()
    env = pipeline_env(kafka_settings, tmp_path, TTFT_STORE__HTTP_PORT=str(port))
    pipe = Pipeline(env, tmp_path)
    # Four minutes of event time ending now: windows close while the traffic still flows.
    traffic = build_traffic(REQUESTS, start_ms=time.time() * 1000 - 240_000, spacing_ms=30.0)
    sent: list[int] = []
    checked = threading.Event()
    try:
        writer = pipe.start("writer", free_port())
        join = pipe.start("join", free_port())
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        url = f"http://127.0.0.1:{port}"
        pipe.wait_for(lambda: url in writer.log(), 30, "the writer to log its interface's URL")
        # The run file is rewritten with the URL once the writer's start-up is over (its hooks installed),
        # a moment after the log line: readers find the interface through it.
        pipe.wait_for(lambda: _run_file_names(tmp_path, url), 30, "the writer's run file to name its URL")

        def produce() -> None:
            messages, topic = traffic.messages, kafka_settings.topic("stage-events")
            done = 0
            while done < len(messages):
                size = len(messages) if checked.is_set() else len(messages) // SLICES + 1
                sent.append(produce_sync(env["TTFT_KAFKA_BOOTSTRAP"], topic, messages[done : done + size]))
                done += size
                checked.wait(1.0)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            _while_ingesting(env, url, port, traffic, tmp_path)
            assert producer.is_alive(), "the checks ran after the traffic ended: not during ingestion"
        finally:
            checked.set()
            producer.join(timeout=120)
        assert sum(sent) == len(traffic.messages)
        app = f"app-{kafka_settings.topic_prefix}"
        b = kafka_settings.kafka_bootstrap
        pipe.wait_for(
            lambda: (
                group_lag(b, f"{app}-join", [kafka_settings.topic("stage-events")]) == 0
                and group_lag(b, f"{app}-writer", [kafka_settings.topic("requests")]) == 0
            ),
            120,
            "the pipeline to drain",
        )
        _clients_agree(port, kafka_settings.clickhouse_database)
        assert pipe.stop(join) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()


def _while_ingesting(env: dict[str, str], url: str, port: int, traffic: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    request_id = next(iter(traffic.truth))
    request = _until_ok(env, "request", request_id, "--json")
    assert request.returncode == 0, request.stderr[-2000:]
    assert orjson.loads(request.stdout)["request_id"] == request_id
    assert f"reading it through {url}" in request.stderr
    breakdown = _until_ok(env, "breakdown", "--json", "--since", "1h")
    assert breakdown.returncode == 0, breakdown.stderr[-2000:]
    assert orjson.loads(breakdown.stdout), breakdown.stdout[:500]
    report = _ttft(env, "report", "--since", "1h", "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-2000:]
    rules = _ttft(env, "rules", "status", "--timeout", "20")
    assert rules.returncode == 0, rules.stderr[-2000:]
    now = int(time.time() * 1000)
    items = dashboard_queries(now - 3_600_000, now)
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port, database="ttft")
    for q in items:
        client.query(q.sql)  # raises on any error
    go = run_go(go_client(), port, items, database="ttft")
    assert not [k for k, v in go.items() if "error" in v], {k: v for k, v in go.items() if "error" in v}
    with pytest.raises(DatabaseError, match="Code: 164"):
        client.command("INSERT INTO ttft.requests (request_id, tenant_id) VALUES ('x', 'y')")
    seconds = time.monotonic() - started
    print(f"read commands and {len(items)} dashboard queries x 2 clients during ingestion: {seconds:.1f} s")


def _clients_agree(port: int, database: str) -> None:
    """clickhouse-connect and the Go driver get the same rows for every dashboard query (asked again while
    the writer still closes windows: rows that changed between two clickhouse-connect reads do not count)."""
    now = int(time.time() * 1000)
    items = dashboard_queries(now - 3_600_000, now)
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port, database=database)
    for _ in range(3):
        want = {q.id: canonical_rows(client.query(q.sql).result_rows) for q in items}
        got = run_go(go_client(), port, items, database=database)
        again = {q.id: canonical_rows(client.query(q.sql).result_rows) for q in items}
        differ = [k for k in want if got[k].get("rows") != want[k] and want[k] == again[k]]
        if [k for k in want if want[k] != again[k]]:
            continue  # the store moved under the comparison: ask again
        break
    first = [(k, [(a, b) for a, b in zip(got[k].get("rows", []), want[k], strict=False) if a != b][:2]) for k in differ]
    assert not differ, (
        first[:3],
        {k: (got[k].get("columns"), len(got[k].get("rows", [])), len(want[k])) for k in differ},
    )
    assert sum(1 for rows in want.values() if rows) >= len(items) // 2
