-- Alert transitions (streams/rules/model.py AlertTransition.to_row), one row per lifecycle step.
--
-- Idempotency: every time column is event time (window starts), so a replay or a re-delivered
-- ttft.alerts message produces the same key. ReplacingMergeTree keyed by (fingerprint, state, event_at)
-- keeps one row per step after merges / FINAL, whichever copy arrived last (inserted_at).
-- Labels identify an alert (fingerprint = sha256 of its sorted labels), numbers live in `numbers` and
-- `annotations`, never in labels. `muted` marks transitions of a replay or backfill (never paged).
CREATE TABLE IF NOT EXISTS {database}.alerts
(
    fingerprint  String,
    alertname    LowCardinality(String),
    tenant_id    String,
    stage        LowCardinality(String),
    version_id   String,
    severity     LowCardinality(String),
    state        LowCardinality(String),
    labels       Map(String, String),
    annotations  Map(String, String),
    numbers      Map(String, Float64),
    window_start DateTime64(3, 'UTC'),
    event_at     DateTime64(3, 'UTC'),
    active_at    DateTime64(3, 'UTC'),
    fired_at     Nullable(DateTime64(3, 'UTC')),
    resolved_at  Nullable(DateTime64(3, 'UTC')),
    muted        Bool DEFAULT false,
    inserted_at  DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC'),
    INDEX idx_tenant_id tenant_id TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMM(event_at)
ORDER BY (fingerprint, state, event_at);

-- Canary verdicts (streams/rules/model.py CanaryVerdict.to_row): one row per evaluation of a tenant x
-- stage x canary version, pass / fail / inconclusive, with the mix-adjusted and the naive comparison.
-- A replayed evaluation of the same window replaces its row (same key).
CREATE TABLE IF NOT EXISTS {database}.canary_verdicts
(
    window_start      DateTime64(3, 'UTC'),
    tenant_id         String,
    stage             LowCardinality(String),
    canary_version    String,
    stable_versions   Array(String),
    verdict           LowCardinality(String),
    reason            LowCardinality(String),
    n_canary          UInt64,
    n_stable          UInt64,
    p95_canary        Nullable(Float64),
    p95_stable        Nullable(Float64),
    ratio             Nullable(Float64),
    delta_ms          Nullable(Float64),
    tail_share_canary Nullable(Float64),
    tail_share_stable Nullable(Float64),
    tail_z            Nullable(Float64),
    tail_p            Nullable(Float64),
    naive_p95_canary  Nullable(Float64),
    naive_ratio       Nullable(Float64),
    naive_verdict     LowCardinality(String),
    mix_adjusted      Bool,
    mix_coverage      Nullable(Float64),
    drivers           Array(String),
    explanation       String,
    inserted_at       DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(inserted_at)
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, tenant_id, stage, canary_version);
