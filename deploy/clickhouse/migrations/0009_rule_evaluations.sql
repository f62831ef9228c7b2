-- Every rule evaluation (streams/rules/model.py RuleEvaluation.to_row): one row per window x tenant x
-- rule x stage x version, with its outcome (ok / breach / hold / insufficient_traffic /
-- insufficient_history / inconclusive / degraded), the span of windows it used and the samples its gate
-- counted. `last_decided_at` is the latest window in which that series could decide (NULL: never yet).
--
-- Idempotency: the key is event time plus the series, so a replayed or re-evaluated window replaces its
-- row (ReplacingMergeTree by inserted_at); read it with FINAL.
CREATE TABLE IF NOT EXISTS {database}.rule_evaluations
(
    window_start    DateTime64(3, 'UTC'),
    tenant_id       String,
    rule            LowCardinality(String),
    stage           LowCardinality(String),
    version_id      String,
    outcome         LowCardinality(String),
    span_windows    UInt32,
    samples         UInt64,
    last_decided_at Nullable(DateTime64(3, 'UTC')),
    inserted_at     DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC'),
    INDEX idx_tenant_id tenant_id TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, tenant_id, rule, stage, version_id)
TTL toDateTime(window_start) + INTERVAL 400 DAY;

-- The span (windows) a canary verdict compared the arms over (it grows with the canary's lifetime).
ALTER TABLE {database}.canary_verdicts ADD COLUMN IF NOT EXISTS span_windows UInt32 DEFAULT 0;
