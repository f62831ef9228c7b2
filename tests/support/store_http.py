"""The store's HTTP interface in a test process, every dashboard query as Grafana sends it, rows to compare.

- :func:`serve`: :class:`~streams.store.http_interface.StoreHttpInterface` over this process's chDB store,
  on a free port, in its own event loop thread with its own single "store thread" (as in the writer).
- :func:`dashboard_queries`: every panel, variable and annotation query of ``dashboards/*.json`` expanded
  as the plugin does (:func:`streams.grafana.macros.expand_query`), for a time range and a selection.
- :func:`canonical`: a row value in a form that compares equal across clients (clickhouse-connect's Python
  values, the Go client's JSON): times as integer microseconds since the epoch, non-finite floats as strings.
- :func:`go_client`: builds ``tests/go/chquery`` (clickhouse-go v2 over HTTP, configured as the Grafana
  plugin configures it) once into ``.cache/go-chquery/``, and :func:`run_go` runs queries through it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import hashlib
import ipaddress
import json
import math
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.grafana.macros import QueryContext, Variable, expand_query, panel_interval_ms
from streams.ports import free_port
from streams.settings import Settings
from streams.store.http_interface import StoreHttpInterface
from tests.support.panel_check import queries

REPO = Path(__file__).resolve().parents[2]
GO_SOURCE = REPO / "tests" / "go" / "chquery"


@dataclass
class Served:
    """A running interface: its URL, port, and the executor standing for the writer's store thread."""

    interface: StoreHttpInterface
    port: int
    store_thread: ThreadPoolExecutor
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def on_store_thread(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the store thread, from a test thread (as the writer's inserts do)."""
        return self.store_thread.submit(fn, *args).result()


@contextmanager
def serve(chdb_path: str, **store: Any) -> Iterator[Served]:
    """The interface over the chDB store at ``chdb_path`` (this process's), ``store`` overriding StoreConfig."""
    port = free_port()
    settings = Settings(store={"http_port": port, **store})
    store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-store")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-store-http", daemon=True)
    thread.start()

    async def run(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(store_thread, fn, *args)

    interface = StoreHttpInterface(settings, os.path.realpath(chdb_path), run)
    try:
        url = asyncio.run_coroutine_threadsafe(interface.start(), loop).result(timeout=30)
        assert url == f"http://127.0.0.1:{port}", url
        yield Served(interface, port, store_thread, loop)
    finally:
        asyncio.run_coroutine_threadsafe(interface.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        store_thread.shutdown(wait=True)


@dataclass(frozen=True)
class DashboardQuery:
    id: str
    sql: str


def dashboard_queries(from_ms: int, to_ms: int, chosen: Mapping[str, Variable] | None = None) -> list[DashboardQuery]:
    """Every query of every dashboard over [from_ms, to_ms], variables at *All* (or their default) unless
    ``chosen``."""
    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text(encoding="utf-8"))
        variables = {v["name"]: (chosen or {}).get(v["name"], _default(v)) for v in model["templating"]["list"]}
        for suffix, raw_sql, panel in queries(model):
            panel = panel or {}
            interval = panel_interval_ms(from_ms, to_ms, panel.get("maxDataPoints", 500), panel.get("interval"))
            sql = expand_query(raw_sql, QueryContext(from_ms, to_ms, interval), variables)
            out.append(DashboardQuery(f"{path.stem}/{suffix}", sql))
    return out


def _default(variable: dict[str, Any]) -> Variable:
    if variable.get("type") == "custom":
        options = tuple(str(o["value"]) for o in variable["options"])
        return Variable(variable["name"], options, (str(variable["current"]["value"]),))
    if variable.get("type") == "textbox":  # its default text (the request board: empty, the slowest request)
        value = str(variable["current"]["value"])
        return Variable(variable["name"], (value,), (value,))
    return Variable(variable["name"], ())


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data that two clients agree on (see the module docstring)."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return (aware - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days * 86_400_000_000
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, decimal.Decimal):
        return format(value.normalize(), "f")  # as shopspring/decimal prints it: no exponent, no trailing zeros
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, uuid.UUID | ipaddress.IPv4Address | ipaddress.IPv6Address):
        return str(value)
    if isinstance(value, dict):
        return {str(canonical(k)): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def canonical_rows(rows: Any) -> list[Any]:
    return [canonical(list(row)) for row in rows]


# --- the Go client ---------------------------------------------------------------------------------


def go_client() -> Path:
    """The chquery binary, built from tests/go/chquery into .cache/go-chquery/<source hash>/ when missing."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise RuntimeError("Go is not installed: the clickhouse-go test client cannot be built")
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((GO_SOURCE / name).read_bytes())
    binary = REPO / ".cache" / "go-chquery" / digest.hexdigest()[:12] / "chquery"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        out = subprocess.run(
            [go, "build", "-mod=readonly", "-o", str(partial), "."],
            cwd=GO_SOURCE,
            capture_output=True,
            timeout=600,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"go build of tests/go/chquery failed:\n{out.stderr.decode()[-3000:]}")
        partial.replace(binary)
    return binary


def run_go(
    binary: Path, port: int, items: list[DashboardQuery], database: str, password: str = "", timeout_s: float = 180
) -> dict[str, dict[str, Any]]:
    """Run ``items`` through the Go client, one connection pool; id -> {"columns", "rows"} or {"error", "code"}."""
    lines = "".join(json.dumps({"id": q.id, "sql": q.sql}) + "\n" for q in items)
    cmd = [str(binary), "-addr", f"127.0.0.1:{port}", "-database", database, "-password", password]
    out = subprocess.run(cmd, input=lines.encode(), capture_output=True, timeout=timeout_s, check=False)
    if out.returncode != 0:
        raise AssertionError(f"chquery exited {out.returncode}:\n{out.stderr.decode()[-3000:]}")
    results = [json.loads(line) for line in out.stdout.decode().splitlines() if line]
    return {r.pop("id"): r for r in results}
