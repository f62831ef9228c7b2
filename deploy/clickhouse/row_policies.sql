-- Tenant-scoped read access: an example to adapt, NOT a migration (`ttft db migrate` never runs it).
--
-- Model: a tenant reader is a SQL-defined user holding the role ttft_tenant_viewer and a constant custom
-- setting SQL_ttft_tenant = '<tenant_id>' (custom settings need the server's default
-- custom_settings_prefixes = 'SQL_'). Every table with a tenant_id column gets two permissive policies:
--   ttft_tenant_scope  rows of the reader's own tenant, for ttft_tenant_viewer;
--   ttft_full_access   every row, for everybody else (ttft_writer, grafana_ro, admins).
-- The second one is NOT optional: once a table has any row policy, a user that no policy names sees no
-- rows at all. Without it the writer's window closer would read empty `requests` and write empty
-- aggregates. Create both in one go, as below.
--
-- Properties worth knowing:
--   * getSetting() fails for a user without SQL_ttft_tenant, so a misconfigured reader gets an error,
--     never another tenant's rows (fails closed). CONST stops the reader from changing the setting.
--   * All versions of a request share its tenant (a second tenant is dead-lettered), so filtering
--     before ReplacingMergeTree FINAL cannot surface a stale version.
--   * dead_letters rows without a tenant (undecodable input) are hidden from tenant readers.
--   * Series over the caps.max_series cap are stored under tenant '__other__', which no tenant sees.
--   * pipeline_stats and schema_migrations carry no tenant: the role gets no SELECT on them.
--
-- Apply as a user with access management (compose: CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT=1):
--   docker compose -f deploy/compose.yaml exec clickhouse \
--       clickhouse-client --multiquery --queries-file /opt/ttft/row_policies.sql
-- If TTFT_CLICKHOUSE_DATABASE is not `ttft`, replace `ttft.` below. tests/unit/test_deploy.py checks that
-- every table with a tenant_id column in deploy/clickhouse/migrations has both policies and a grant,
-- and that each condition parses and runs against the migrated schema.

CREATE ROLE IF NOT EXISTS ttft_tenant_viewer;

GRANT SELECT ON ttft.requests TO ttft_tenant_viewer;
GRANT SELECT ON ttft.dead_letters TO ttft_tenant_viewer;
GRANT SELECT ON ttft.stage_windows TO ttft_tenant_viewer;
GRANT SELECT ON ttft.stage_strata TO ttft_tenant_viewer;
GRANT SELECT ON ttft.tail_attribution TO ttft_tenant_viewer;
GRANT SELECT ON ttft.window_health TO ttft_tenant_viewer;
GRANT SELECT ON ttft.llm_signals TO ttft_tenant_viewer;
GRANT SELECT ON ttft.alerts TO ttft_tenant_viewer;
GRANT SELECT ON ttft.canary_verdicts TO ttft_tenant_viewer;
GRANT SELECT ON ttft.rule_evaluations TO ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.requests FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.requests FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.dead_letters FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.dead_letters FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.stage_windows FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.stage_windows FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.stage_strata FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.stage_strata FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.tail_attribution FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.tail_attribution FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.window_health FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.window_health FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.llm_signals FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.llm_signals FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.alerts FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.alerts FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.canary_verdicts FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.canary_verdicts FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

CREATE ROW POLICY OR REPLACE ttft_tenant_scope ON ttft.rule_evaluations FOR SELECT USING tenant_id = getSetting('SQL_ttft_tenant') TO ttft_tenant_viewer;
CREATE ROW POLICY OR REPLACE ttft_full_access ON ttft.rule_evaluations FOR SELECT USING 1 TO ALL EXCEPT ttft_tenant_viewer;

-- One reader per tenant (example; one user per tenant, a real password or an sha256 hash). Granted roles
-- are enabled by default. max_execution_time stays changeable because Grafana's client sends it:
--   CREATE USER IF NOT EXISTS tenant_acme IDENTIFIED WITH sha256_password BY '<placeholder-password>'
--       SETTINGS readonly = 1, max_execution_time = 60 MIN 1 MAX 300 CHANGEABLE_IN_READONLY,
--                SQL_ttft_tenant = 'acme' CONST;
--   GRANT ttft_tenant_viewer TO tenant_acme;
-- A Grafana organisation or data source per tenant then connects as that user.
