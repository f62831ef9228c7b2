"""Reading the embedded store while a writer holds it: through the writer's read-only HTTP interface.

A chDB directory opens in one process only. While ``ttft worker`` runs, its writer holds the store and
serves it over ClickHouse's HTTP interface (:mod:`streams.store.http_interface`), and says where in its run
file, ``$TTFT_HOME/run/writer-<id>.json``: ``store_path`` (the directory it holds) and ``store_http`` (the
interface's URL, null when the interface is off). :func:`reader_client` is how the read commands
(``ttft breakdown``, ``report``, ``request``, ``whatif``) open the store: the embedded engine when no live
writer holds it, else that writer's interface, with one line on stderr saying so. A ClickHouse server URL
is used as it is.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from clickhouse_connect.driver.client import Client
from pydantic import SecretStr

from streams.settings import Settings
from streams.store.client import StoreUnavailable, chdb_path, make_client


@dataclass(frozen=True, slots=True)
class LiveWriter:
    """A running writer, from its run file."""

    pid: int
    worker_id: str
    store_path: str | None
    store_http: str | None


def live_writers(settings: Settings) -> list[LiveWriter]:
    """The writers whose run file is under ``settings.home`` and whose process is alive."""
    found = []
    for path in sorted((settings.home / "run").glob("writer-*.json")):
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a run file being replaced, or not ours
        if _alive(pid):
            worker = str(info.get("worker_id", ""))
            found.append(LiveWriter(pid, worker, info.get("store_path"), info.get("store_http")))
    return found


def store_holder(settings: Settings) -> LiveWriter | None:
    """The live writer holding this settings' embedded store, if any (None for a ClickHouse server)."""
    if urlsplit(settings.store_url).scheme.lower() != "chdb":
        return None
    path = chdb_path(settings.store_url)
    return next((w for w in live_writers(settings) if w.store_path == path), None)


def reader_client(settings: Settings, note: Callable[[str], None] | None = None) -> Client:
    """A client for reading the store: the store itself, or the interface of the live writer that holds it.

    ``note`` receives the one line that says the writer's interface is used (default: stderr). Raises
    :class:`~streams.store.client.StoreUnavailable` when the holder serves no interface.
    """
    holder = store_holder(settings)
    if holder is None:
        return make_client(settings)
    if holder.store_http is None:
        raise StoreUnavailable(
            f"the chDB store {holder.store_path} is held by the running writer (pid {holder.pid}) and its HTTP "
            "interface is off (TTFT_STORE__HTTP_PORT=0, or its port was taken: see the writer's log)"
        )
    (note or _stderr)(
        f"ttft: the store is held by the running writer (pid {holder.pid}): reading it through {holder.store_http}"
    )
    through = settings.model_copy(
        update={
            "clickhouse_url": SecretStr(holder.store_http),
            "clickhouse_user": "default",
            "clickhouse_password": settings.store.http_password,
        }
    )
    return make_client(through)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
