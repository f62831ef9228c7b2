-- Issue 25: a retried stage whose second attempt reached the join after it forgot the request came as a
-- late amendment, and the writer kept the stored (first) attempt only: the stored row could not tell a retry
-- (a new event: summed, DESIGN.md) from a replay (an event already counted). requests now keeps the
-- identities of the events each row counted. Rows written before keep [] and merge as before (a stage
-- already present is left as it is). The statement can run twice.
ALTER TABLE {database}.requests ADD COLUMN IF NOT EXISTS event_keys Array(Int64) DEFAULT [] AFTER event_count;
