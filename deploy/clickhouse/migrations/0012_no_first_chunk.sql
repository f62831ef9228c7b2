-- Issue 25: a request whose LLM call was answered but whose telemetry tells no first chunk (an OTLP LLM span
-- without a first-chunk attribute or event: the reserved stage `llm_unmeasured`) has a status of its own,
-- `no_first_chunk`, instead of `timed_out`: counted in window_health beside the other statuses, never
-- SLO-bad. requests keeps the LLM call's whole duration in llm_unmeasured_ms (an upper bound of llm_ttft,
-- never a stage value). Rows written before stay as they were: NULL and 0 (their LLM spans were
-- dead-lettered no_first_chunk and their requests stored timed_out). Each statement can run twice.
ALTER TABLE {database}.requests ADD COLUMN IF NOT EXISTS llm_unmeasured_ms Nullable(Float64) AFTER other_ms;

ALTER TABLE {database}.window_health ADD COLUMN IF NOT EXISTS no_first_chunk UInt64 DEFAULT 0 AFTER timed_out;

ALTER TABLE {database}.window_health
    ADD COLUMN IF NOT EXISTS no_first_chunk_share Float64 DEFAULT 0 AFTER timed_out_share;
