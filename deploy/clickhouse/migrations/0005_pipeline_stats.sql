-- Worker metrics as a time series for the dashboards: consumer lag, insert latency, open requests,
-- evictions, series caps hit, ... One row per (ts, worker, metric, labels) sample. Append-only: a sample
-- written twice shows up twice, so dashboards read max/last per time bucket, never sum().
-- Wall-clock data, kept 30 days (TTL drops whole daily partitions).
CREATE TABLE IF NOT EXISTS {database}.pipeline_stats
(
    ts        DateTime64(3, 'UTC'),
    worker_id LowCardinality(String),
    role      LowCardinality(String),
    metric    LowCardinality(String),
    labels    Map(LowCardinality(String), String),
    value     Float64
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (metric, worker_id, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY DELETE
SETTINGS ttl_only_drop_parts = 1;
