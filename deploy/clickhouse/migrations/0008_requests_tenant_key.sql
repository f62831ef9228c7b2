-- Issue 14: a request is identified by (tenant_id, request_id) everywhere (DESIGN.md, join semantics).
-- The table was keyed by request_id alone, so another tenant reusing a request id replaced or amended the
-- first tenant's row. The sorting key of a MergeTree cannot gain a leading column in place: the rows are
-- copied into a table keyed by (tenant_id, request_id), which then takes the old one's name.
-- Re-runnable: a crash anywhere before the ledger entry restarts from a fresh copy of whatever table is
-- named requests then (the first DROP removes a half-made copy, or the old table after the exchange).
-- Stop the writers first (`ttft db migrate` on a stopped pipeline; a writer applies it itself at start):
-- rows inserted into the old table during the copy would be lost. The copy takes about as long as a
-- full scan of the table.
DROP TABLE IF EXISTS {database}.requests_by_tenant;

CREATE TABLE IF NOT EXISTS {database}.requests_by_tenant
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
ORDER BY (tenant_id, request_id)
TTL toDateTime(started_at) + INTERVAL 30 DAY;

INSERT INTO {database}.requests_by_tenant SELECT * FROM {database}.requests;

EXCHANGE TABLES {database}.requests AND {database}.requests_by_tenant;

DROP TABLE {database}.requests_by_tenant;
