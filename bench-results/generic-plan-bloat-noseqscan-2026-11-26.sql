-- generic-plan-bloat-2026-11-26.sql with the fix of bmdb's probePlanning:
-- enable_seqscan off before the statement is prepared, as claims and lease
-- ends are planned since 2026-11-26. The prepared statement's generic plan,
-- made while `work` holds 60 rows, probes its key, and still does after the
-- table bloats. Run against a scratch PostgreSQL 15 server with autovacuum off,
-- never a BMDB (output: generic-plan-bloat-noseqscan-2026-11-26.txt):
--   psql -f bench-results/generic-plan-bloat-noseqscan-2026-11-26.sql
-- Everything lives in the schema plan_demo, never in a BMDB's tables.
DROP SCHEMA IF EXISTS plan_demo CASCADE;
CREATE SCHEMA plan_demo;
SET search_path = plan_demo;
-- The fix (bmdb probePlanning): no whole-table scan where an index serves.
SET enable_seqscan = off;
CREATE TABLE machines (machine_id uuid PRIMARY KEY);
CREATE TABLE work (machine_id uuid NOT NULL, exclusion_group text NOT NULL, process text NOT NULL, PRIMARY KEY (machine_id, exclusion_group), UNIQUE (machine_id, process));
INSERT INTO machines SELECT gen_random_uuid() FROM generate_series(1,100000);
INSERT INTO work SELECT machine_id, 'G', 'P' FROM machines LIMIT 60;
VACUUM ANALYZE machines, work;
PREPARE a(uuid[], text) AS SELECT count(*) FILTER (WHERE leased) FROM (SELECT m.machine_id, EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.exclusion_group = $2) AS leased FROM unnest($1::uuid[]) AS d(machine_id) JOIN machines m ON m.machine_id = d.machine_id) x;
SELECT array_agg(machine_id)::text AS ids FROM (SELECT machine_id FROM machines ORDER BY machine_id LIMIT 136) s \gset
EXECUTE a(:'ids', 'G'); EXECUTE a(:'ids', 'G'); EXECUTE a(:'ids', 'G'); EXECUTE a(:'ids', 'G'); EXECUTE a(:'ids', 'G'); EXECUTE a(:'ids', 'G'); EXECUTE a(:'ids', 'G');
SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'a';
\echo small table, plan in use:
EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) EXECUTE a(:'ids', 'G');
-- churn: 250k leases taken and ended, no vacuum
DO $$ BEGIN FOR i IN 1..50 LOOP
  INSERT INTO work SELECT machine_id, 'G2', 'P2' FROM machines OFFSET (i*1000) % 95000 LIMIT 5000;
  DELETE FROM work WHERE exclusion_group = 'G2';
END LOOP; END $$;
SELECT pg_relation_size('work')/8192 AS work_pages;
\echo bloated table, same prepared statement:
EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) EXECUTE a(:'ids', 'G');
SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'a';
\echo bloated table, a fresh prepare:
PREPARE b(uuid[], text) AS SELECT count(*) FILTER (WHERE leased) FROM (SELECT m.machine_id, EXISTS (SELECT 1 FROM work w WHERE w.machine_id = m.machine_id AND w.exclusion_group = $2) AS leased FROM unnest($1::uuid[]) AS d(machine_id) JOIN machines m ON m.machine_id = d.machine_id) x;
EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) EXECUTE b(:'ids', 'G');
