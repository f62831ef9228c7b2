-- Window aggregates computed by streams.core.windows.aggregate_window from `requests FINAL`.
-- Every table is a ReplacingMergeTree keyed by its window key with version `computed_version`, so a
-- recompute of a window (late record, replay, restart) replaces its rows instead of adding to them.
-- Read with FINAL. Sketches are `bins Map(Int32, UInt64)` + `zero_count`: merge with sumMap and take
-- quantiles with ttftSketchQuantile (migration 0004) or streams.store.sketch_sql, never quantile*.

CREATE TABLE IF NOT EXISTS {database}.stage_windows
(
    window_start      DateTime64(3, 'UTC'),
    tenant_id         LowCardinality(String),
    version_id        LowCardinality(String),
    stage             LowCardinality(String),
    count             UInt64,
    p50               Nullable(Float64),
    p90               Nullable(Float64),
    p95               Nullable(Float64),
    p99               Nullable(Float64),
    max               Nullable(Float64),
    bins              Map(Int32, UInt64),
    zero_count        UInt64,
    slo_bad_count     UInt64,
    negative_count    UInt64,
    relative_accuracy Float64,
    computed_version  UInt64
)
ENGINE = ReplacingMergeTree(computed_version)
PARTITION BY toYYYYMM(window_start)
ORDER BY (tenant_id, version_id, stage, window_start);

CREATE TABLE IF NOT EXISTS {database}.stage_strata
(
    window_start      DateTime64(3, 'UTC'),
    tenant_id         LowCardinality(String),
    version_id        LowCardinality(String),
    stage             LowCardinality(String),
    route             LowCardinality(String),
    prompt_cache      LowCardinality(String),
    prompt_bucket     LowCardinality(String),
    count             UInt64,
    bins              Map(Int32, UInt64),
    zero_count        UInt64,
    relative_accuracy Float64,
    computed_version  UInt64
)
ENGINE = ReplacingMergeTree(computed_version)
PARTITION BY toYYYYMM(window_start)
ORDER BY (tenant_id, version_id, stage, window_start, route, prompt_cache, prompt_bucket);

CREATE TABLE IF NOT EXISTS {database}.tail_attribution
(
    window_start         DateTime64(3, 'UTC'),
    tenant_id            LowCardinality(String),
    version_id           LowCardinality(String),
    status               LowCardinality(String),
    n                    UInt64,
    ttft_p95             Nullable(Float64),
    tail_count           UInt64,
    band_count           UInt64,
    biggest_p95_stage    LowCardinality(String),
    tail_dominant_stage  LowCardinality(String),
    stage_p95            Map(String, Float64),
    tail_share           Map(String, Float64),
    band_share           Map(String, Float64),
    share_delta          Map(String, Float64),
    exemplar_request_ids Array(String),
    computed_version     UInt64
)
ENGINE = ReplacingMergeTree(computed_version)
PARTITION BY toYYYYMM(window_start)
ORDER BY (tenant_id, version_id, window_start);

CREATE TABLE IF NOT EXISTS {database}.window_health
(
    window_start        DateTime64(3, 'UTC'),
    tenant_id           LowCardinality(String),
    version_id          LowCardinality(String),
    total               UInt64,
    complete            UInt64,
    missing_stage       UInt64,
    timed_out           UInt64,
    orphan              UInt64,
    complete_share      Float64,
    missing_stage_share Float64,
    timed_out_share     Float64,
    orphan_share        Float64,
    late_events         UInt64,
    late_amendments     UInt64,
    amendments          UInt32,
    dead_letters        UInt64,
    duplicate_events    UInt64,
    overflow_series     UInt32,
    computed_version    UInt64
)
ENGINE = ReplacingMergeTree(computed_version)
PARTITION BY toYYYYMM(window_start)
ORDER BY (tenant_id, version_id, window_start);

CREATE TABLE IF NOT EXISTS {database}.llm_signals
(
    window_start          DateTime64(3, 'UTC'),
    tenant_id             LowCardinality(String),
    version_id            LowCardinality(String),
    requests              UInt64,
    prompt_cache_known    UInt64,
    prompt_cache_hits     UInt64,
    prompt_cache_hit_rate Nullable(Float64),
    prompt_tokens_known   UInt64,
    below_cacheable       UInt64,
    below_cacheable_share Nullable(Float64),
    cacheable_min_tokens  UInt32,
    draft_accept_count    UInt64,
    draft_accept_p50      Nullable(Float64),
    draft_accept_p10      Nullable(Float64),
    route_mix             Map(String, UInt64),
    fallback_mix          Map(String, UInt64),
    recall_mode_mix       Map(String, UInt64),
    rerank_top_k_count    UInt64,
    rerank_top_k_p50      Nullable(UInt32),
    rerank_top_k_max      Nullable(UInt32),
    computed_version      UInt64
)
ENGINE = ReplacingMergeTree(computed_version)
PARTITION BY toYYYYMM(window_start)
ORDER BY (tenant_id, version_id, window_start);
