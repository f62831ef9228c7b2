"""The guard of tests/fixtures/network_guard.py: an unmarked test that opens a socket or the store fails."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from streams.settings import Settings
from streams.store.client import StoreUnavailable, chdb_path_in_use, make_client
from tests.fixtures.network_guard import GuardTripped, guard, guards_for


def test_markers_decide_what_is_blocked() -> None:
    assert guards_for(set()) == (True, True)
    assert guards_for({"slow", "timeout", "parametrize"}) == (True, True)
    assert guards_for({"net"}) == (False, True)
    for component in ("kafka", "alertmanager", "e2e", "otel"):
        assert guards_for({component}) == (False, True), component
    assert guards_for({"clickhouse"}) == (False, False)


def test_tcp_connect_and_bind_trip_with_the_marker_to_add() -> None:
    with guard(sockets=True, store=False) as tripped:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(GuardTripped) as info:
            sock.connect(("127.0.0.1", 9))
        assert "this test opens a socket" in str(info.value) and "@pytest.mark.net" in str(info.value)
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock, pytest.raises(GuardTripped):
            sock.connect_ex(("::1", 9))
        with socket.socket() as sock, pytest.raises(GuardTripped):
            sock.bind(("127.0.0.1", 0))
        with pytest.raises(GuardTripped):
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        # Not an OSError: a retry loop that absorbs connection errors does not absorb this one.
        assert not issubclass(GuardTripped, OSError)
    assert len(tripped) == 4


def test_unix_sockets_socketpair_and_the_event_loop_still_work(tmp_path: Path) -> None:
    with guard() as tripped:
        left, right = socket.socketpair()
        with left, right:
            left.sendall(b"x")
            assert right.recv(1) == b"x"
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(tmp_path / "s"))
            server.listen()
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(tmp_path / "s"))
        assert asyncio.run(asyncio.sleep(0, result=7)) == 7
    assert tripped == []


def test_opening_the_embedded_store_trips(tmp_path: Path) -> None:
    before = chdb_path_in_use()  # None, or the session's store if a clickhouse test ran first
    with guard(sockets=False, store=True) as tripped:
        with pytest.raises(GuardTripped, match=r"opens the store .*mark it @pytest.mark.clickhouse"):
            clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "a"))
        # The session's store, if a clickhouse test opened one first (one chDB directory per process).
        path = before or str(tmp_path / "b")
        with pytest.raises(StoreUnavailable, match=r"mark it @pytest.mark.clickhouse"):
            make_client(Settings(clickhouse_url=SecretStr(f"chdb://{path}")), shared=False)
    assert len(tripped) == 2
    assert chdb_path_in_use() == before


def test_an_unmarked_test_fails_and_a_swallowed_violation_fails_at_teardown(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["tests.fixtures.network_guard"]\n')
    pytester.makepyfile(
        """
        import asyncio
        import socket

        def test_connects():
            socket.create_connection(("127.0.0.1", 9), timeout=1)

        def test_swallows():
            try:
                socket.socket().bind(("127.0.0.1", 0))
            except Exception:
                pass

        def test_pure():
            assert asyncio.run(asyncio.sleep(0, result=1)) == 1
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_swallows*",
            "*::test_swallows: this test opens a socket (socket.bind(('127.0.0.1', 0))): mark it @pytest.mark.net*",
            "*FAILURES*",
            "*GuardTripped: this test opens a socket (socket.connect(('127.0.0.1', 9))): mark it @pytest.mark.net*",
        ]
    )


@pytest.mark.net
def test_threads_older_than_the_test_are_not_its_doing() -> None:
    go, done = threading.Event(), threading.Event()
    outcome: list[object] = []

    def older() -> None:
        go.wait(5)
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
            outcome.append("bound")
        except GuardTripped as exc:
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=older, daemon=True)
    thread.start()
    with guard() as tripped:
        go.set()
        assert done.wait(5)
        new = threading.Thread(target=lambda: outcome.append(_try_bind()), daemon=True)
        new.start()
        new.join(5)
    assert outcome[0] == "bound" and isinstance(outcome[1], GuardTripped)
    assert len(tripped) == 1


def _try_bind() -> object:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
        return "bound"
    except GuardTripped as exc:
        return exc


@pytest.mark.clickhouse
def test_a_query_on_an_already_open_store_trips(ch_client: Client) -> None:
    with guard(sockets=False, store=True) as tripped, pytest.raises(GuardTripped, match="existing chDB client"):
        ch_client.command("SELECT 1")
    assert tripped and ch_client.command("SELECT 1") == 1
