"""Processes that open the embedded store end with their own exit status (issue 11).

chDB's native teardown sometimes crashed with SIGSEGV after the work was done (139 after "711 passed").
Each check below starts real processes many times and compares every exit status with the expected one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streams.ports import free_port
from streams.settings import Settings
from tests.support.pipeline import REPO, Pipeline, pipeline_env

TTFT = str(Path(sys.executable).with_name("ttft"))
#: Every check starts processes dozens of times (tens of seconds each): not for the fast tier.
pytestmark = pytest.mark.slow

RUNS = 30
PARALLEL = 3

_SESSION_TEST = textwrap.dedent(
    """
    import os

    from pydantic import SecretStr

    from streams.settings import Settings
    from streams.store.client import make_client


    def test_store_round_trip() -> None:
        client = make_client(Settings(clickhouse_url=SecretStr("chdb://" + os.environ["STORE_DIR"])))
        client.command("CREATE DATABASE IF NOT EXISTS exit_check")
        client.command(
            "CREATE TABLE IF NOT EXISTS exit_check.t (n UInt64) ENGINE = MergeTree ORDER BY n"
        )
        client.insert("exit_check.t", [[i] for i in range(1000)], column_names=["n"], database="exit_check")
        assert client.query("SELECT count() FROM exit_check.t").result_rows[0][0] >= 1000
        assert os.environ["EXPECT"] == "pass"
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    env.update(PYTHONPATH=str(REPO), COLUMNS="120", **extra)
    return env


def _statuses(jobs: list[tuple[list[str], dict[str, str], Path]]) -> list[tuple[int, str]]:
    def run(job: tuple[list[str], dict[str, str], Path]) -> tuple[int, str]:
        cmd, env, cwd = job
        done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, done.stdout[:2000] + done.stderr[-2000:]

    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(run, jobs))


@pytest.mark.clickhouse
def test_short_pytest_sessions_on_the_store_exit_with_pytest_status(tmp_path: Path) -> None:
    (tmp_path / "test_store_session.py").write_text(_SESSION_TEST)
    jobs = []
    expected = []
    for i in range(RUNS):
        outcome = "pass" if i % 2 == 0 else "fail"
        expected.append(0 if outcome == "pass" else 1)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.store_exit"]
        cmd += ["--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_store_session.py")]
        jobs.append((cmd, _env(STORE_DIR=str(tmp_path / f"store-{i}"), EXPECT=outcome), tmp_path))
    results = _statuses(jobs)
    got = [rc for rc, _ in results]
    print(f"pytest sessions: expected {expected.count(0)} x 0 and {expected.count(1)} x 1; got {sorted(got)}")
    assert got == expected, [out for (rc, out), want in zip(results, expected, strict=True) if rc != want][:2]


@pytest.mark.clickhouse
def test_breakdown_on_a_filled_store_exits_0_every_time(tmp_path: Path) -> None:
    # One process per chDB directory (a copied directory does not load): each lane fills its own store.
    homes = [tmp_path / f"lane-{lane}" for lane in range(PARALLEL)]
    fill = [sys.executable, str(REPO / "tests/support/fill_store_pure.py"), "--minutes", "3", "--rate", "5"]
    filled = _statuses([(fill, _env(TTFT_HOME=str(home)), REPO) for home in homes])
    assert [rc for rc, _ in filled] == [0] * PARALLEL, filled
    # One process per chDB directory: each batch runs one breakdown per lane, PARALLEL at a time.
    batches = [
        [([TTFT, "breakdown", "--since", "2h"], _env(TTFT_HOME=str(home)), REPO) for home in homes]
        for _ in range(RUNS // PARALLEL)
    ]
    results = [r for batch in batches for r in _statuses(batch)]
    got = [rc for rc, _ in results]
    print(f"ttft breakdown: {len(got)} runs, statuses {sorted(set(got))}")
    assert got == [0] * RUNS, [out for rc, out in results if rc != 0][:2]
    assert all("Stage P95" in out for _, out in results)


@pytest.mark.kafka
@pytest.mark.clickhouse
@pytest.mark.e2e
def test_writer_stopped_by_sigterm_exits_0(kafka_settings: Settings, tmp_path: Path) -> None:
    pipe = Pipeline(pipeline_env(kafka_settings, tmp_path), tmp_path)
    codes = []
    started = time.monotonic()
    for _ in range(10):
        writer = pipe.start("writer", free_port())
        pipe.wait_healthy(writer)
        codes.append(pipe.stop(writer, signal.SIGTERM, timeout=30))
    print(f"writer SIGTERM x10: exit codes {codes} in {time.monotonic() - started:.0f} s")
    assert codes == [0] * 10, writer.log()[-3000:]
