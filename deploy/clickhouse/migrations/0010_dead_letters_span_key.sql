-- Issue 15: one OTLP message (an ExportTraceServiceRequest) can carry several stage spans that cannot be
-- mapped, each its own dead letter with the span's trace and span ids. Keyed by the Kafka coordinates alone
-- they would replace one another; the key gains span_id ('' for a message that is not a span) and the rows
-- keep trace_id. The sorting key cannot change in place: the rows are copied into a table keyed by
-- (source_topic, source_partition, source_offset, span_id), which then takes the old one's name.
-- Re-runnable like 0008: the first DROP removes a half-made copy, or the old table after the exchange.
DROP TABLE IF EXISTS {database}.dead_letters_by_span;

CREATE TABLE IF NOT EXISTS {database}.dead_letters_by_span
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
    trace_id         Nullable(String),
    span_id          String DEFAULT '',
    INDEX idx_received_at received_at TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (source_topic, source_partition, source_offset, span_id)
TTL toDateTime(received_at) + INTERVAL 14 DAY;

INSERT INTO {database}.dead_letters_by_span
    (source_topic, source_partition, source_offset, reason_code, detail, original, original_length, sha256,
     kafka_timestamp, request_id, tenant_id, received_at, inserted_at)
SELECT source_topic, source_partition, source_offset, reason_code, detail, original, original_length, sha256,
       kafka_timestamp, request_id, tenant_id, received_at, inserted_at
FROM {database}.dead_letters;

EXCHANGE TABLES {database}.dead_letters AND {database}.dead_letters_by_span;

DROP TABLE {database}.dead_letters_by_span;
