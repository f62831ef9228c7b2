"""A fixed-looking timestamp that stays inside the store's retention TTLs whatever day the tests run.

The store drops rows older than its TTLs (``deploy/clickhouse/migrations/0007_retention.sql``: 14 days
for dead letters, 30 for requests), and a recent ClickHouse hides expired rows from queries before the
merge that deletes them. Test data stamped with a constant date therefore vanishes once that date is
more than two weeks old. Anchor it here instead: the start of the UTC day two days ago, a window, hour
and day boundary.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

DAY_MS = 86_400_000

RECENT_DAY_MS: int = (int(time.time() * 1000) // DAY_MS - 2) * DAY_MS


def iso_utc(ms: float) -> str:
    """``ms`` as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
