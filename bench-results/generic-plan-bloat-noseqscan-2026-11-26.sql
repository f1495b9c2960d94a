-- generic-plan-bloat-2026-11-26.sql with the fix of bmdb's probePlanning:
-- enable_seqscan off before the statement is prepared, as claims and lease
-- ends are planned since 2026-11-26. The prepared statement's generic plan,
-- made while `work` holds 60 rows, probes its key, and still does after the
-- table bloats. Run against a scratch PostgreSQL 15 server with autovacuum off,
-- never a BMDB (output: generic-plan-bloat-noseqscan-2026-11-26.txt):
--   psql -f bench-results/generic-plan-bloat-noseqscan-2026-11-26.sql
-- Everything lives in the schema plan_demo, never in a BMDB's tables.
SET enable_seqscan = off;
\ir generic-plan-bloat-2026-11-26.sql
