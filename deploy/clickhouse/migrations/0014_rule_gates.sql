-- Gates that keep a rule silent (streams/rules/gates.py): a rule switched off, paging muted, the silence
-- rule watching registered tenants only, a source the join's dead-letter guard holds in quarantine. The
-- writer writes its configuration's gates at start and the quarantines (read from ttft.alerts) as they
-- change; a gate that ends gets a row with active = false. The pipeline-health board shows the active ones
-- ("What keeps rules silent"), so a gate that makes a rule silent says so where on-call looks.
--
-- Idempotency: one row per (gate, rule, scope) after merges / FINAL, the latest by updated_at.
CREATE TABLE IF NOT EXISTS {database}.rule_gates
(
    gate       LowCardinality(String),
    rule       LowCardinality(String),
    scope      String,
    detail     String,
    active     Bool,
    since      DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (gate, rule, scope);
