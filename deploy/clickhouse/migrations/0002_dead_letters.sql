-- Events that failed validation or the join (DESIGN.md: dead letters), with the original bytes
-- (truncated past caps.dead_letter_bytes; original_length and sha256 describe the full message).
-- Idempotent on the Kafka coordinates: a replayed bad message replaces its own row after FINAL.
CREATE TABLE IF NOT EXISTS {database}.dead_letters
(
    source_topic     LowCardinality(String),
    source_partition Int32,
    source_offset    Int64,
    reason_code      LowCardinality(String),
    detail           String,
    original         String,
    original_length  UInt64,
    sha256           String,
    kafka_timestamp  Nullable(DateTime64(3, 'UTC')),
    request_id       Nullable(String),
    tenant_id        Nullable(String),
    received_at      DateTime64(3, 'UTC'),
    inserted_at      DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC'),
    INDEX idx_received_at received_at TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (source_topic, source_partition, source_offset);
