-- Issue 13: several writers on one ClickHouse server. Each writer records, per `ttft.requests` partition it
-- owns, how far the join's event time has provably progressed there *after* inserting every record up
-- to that point (streams/app/window_closer.py). The writer that owns partition 0 closes a window only
-- once every partition's progress has passed it, so a window is never aggregated from part of the
-- writers' rows, and its rules run once, in that one owner.
CREATE TABLE IF NOT EXISTS {database}.writer_progress
(
    requests_partition UInt16,
    progress_ms        Float64,
    writer_id          String,
    updated_at         DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY requests_partition;
