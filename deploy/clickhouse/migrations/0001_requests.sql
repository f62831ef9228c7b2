-- Joined request records (schemas/records.py RequestRecord), one row per request_id after FINAL.
--
-- Idempotency: ReplacingMergeTree(record_version) keyed by request_id ALONE. A replay re-inserts rows and
-- an amendment inserts a merged row; merges (and FINAL at read time) keep the row with the highest
-- record_version, i.e. the most complete record, whatever the arrival order.
-- Why not ORDER BY (tenant_id, window_start, request_id) or PARTITION BY day: an amendment can move
-- started_at (a late request_start for an orphan), so the old and new rows would have different keys or
-- land in different partitions and both survive FINAL. Key and partition are functions of request_id only.
-- Time-range reads rely on the skip indexes: insert batches arrive in event-time order, so recent parts
-- cover narrow window_start ranges and prune well; old merged parts are read in full (the aggregates
-- tables, not this one, serve dashboards over long ranges). Skip indexes are safe with FINAL only in exact
-- mode (use_skip_indexes_if_final_exact_mode=1, the default in ClickHouse 26.9): otherwise pruning can drop
-- a row's newest version and resurrect the old one in its old window. The readers in requests_store.py
-- set exact mode per query, or turn the indexes off under FINAL on a server that lacks it.
CREATE TABLE IF NOT EXISTS {database}.requests
(
    request_id          String,
    tenant_id           LowCardinality(String),
    version_id          LowCardinality(String),
    rollout             LowCardinality(Nullable(String)),
    route               LowCardinality(Nullable(String)),
    fallback_level      UInt16,
    status              LowCardinality(String),
    missing_stages      Array(String),
    started_at          DateTime64(3, 'UTC'),
    first_token_at      Nullable(DateTime64(3, 'UTC')),
    window_start        DateTime64(3, 'UTC'),
    ttft_ms             Nullable(Float64),
    retrieval_ms        Nullable(Float64),
    vector_recall_ms    Nullable(Float64),
    bm25_recall_ms      Nullable(Float64),
    rerank_ms           Nullable(Float64),
    prompt_assemble_ms  Nullable(Float64),
    llm_ttft_ms         Nullable(Float64),
    other_ms            Nullable(Float64),
    custom_stages       Map(String, Float64),
    stage_repeats       Map(String, UInt16),
    recall_mode         LowCardinality(Nullable(String)),
    prompt_tokens       Nullable(UInt32),
    cached_tokens       Nullable(UInt32),
    prompt_cache_hit    Nullable(Bool),
    draft_accept_rate   Nullable(Float64),
    rerank_top_k        Nullable(UInt32),
    retrieval_cache_hit Nullable(Bool),
    trace_id            Nullable(String),
    duplicate_events    UInt32,
    late_events         UInt32,
    event_count         UInt32,
    record_version      UInt64,
    -- True only for an amendment stored without a base row (streams/store/requests_store.py).
    amend               Bool DEFAULT false,
    -- Identities of the amendments merged into this row, so a replayed amendment is not merged twice.
    amendment_ids       Array(String) DEFAULT [],
    inserted_at         DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC'),
    INDEX idx_window_start window_start TYPE minmax GRANULARITY 1,
    INDEX idx_tenant_id tenant_id TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree(record_version)
ORDER BY request_id;
