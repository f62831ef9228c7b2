-- Retention (docs/operations.md, "Topic retention vs ClickHouse TTL"). Exemplar request ids in
-- tail_attribution expire one day before the requests they point to, so an exemplar never outlives its
-- request. Keep the Kafka topics' retention.ms shorter than these TTLs (replay reads the topics).

ALTER TABLE {database}.requests MODIFY TTL toDateTime(started_at) + INTERVAL 30 DAY;

ALTER TABLE {database}.dead_letters MODIFY TTL toDateTime(received_at) + INTERVAL 14 DAY;

ALTER TABLE {database}.tail_attribution
    MODIFY COLUMN exemplar_request_ids Array(String) TTL toDateTime(window_start) + INTERVAL 29 DAY;

ALTER TABLE {database}.stage_windows MODIFY TTL toDateTime(window_start) + INTERVAL 400 DAY;

ALTER TABLE {database}.stage_strata MODIFY TTL toDateTime(window_start) + INTERVAL 400 DAY;

ALTER TABLE {database}.window_health MODIFY TTL toDateTime(window_start) + INTERVAL 400 DAY;

ALTER TABLE {database}.llm_signals MODIFY TTL toDateTime(window_start) + INTERVAL 400 DAY;
