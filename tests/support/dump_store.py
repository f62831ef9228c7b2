"""Print the rows of one SQL query on the configured store as JSON lines (a separate process: chDB holds
one data directory per process). Usage: ``python tests/support/dump_store.py "SELECT ..."``."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

from streams.store.shutdown import exit_process


def _plain(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return v.timestamp() * 1000.0
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def main() -> None:
    from streams.settings import load_settings
    from streams.store.client import make_client

    settings = load_settings()
    client = make_client(settings)
    result = client.query(sys.argv[1].replace("{db}", settings.clickhouse_database))
    for row in result.named_results():
        print(json.dumps({k: _plain(v) for k, v in row.items()}, ensure_ascii=False))


if __name__ == "__main__":
    main()
    exit_process(0)
