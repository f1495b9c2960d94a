#!/usr/bin/env bash
# run.sh DSN: a sketch, not Shepherd's statements. It compares, in plain
# SQL under pgbench, two shapes of a claim + end cycle of 64 machines a
# transaction on a 10k-machine fleet: today's rows (a lease row inserted
# and deleted, a due row deleted and inserted, a Started and a terminal
# history row) and a lease kept in its due row (the claim and the end one
# UPDATE each, one history row per lease). Neither checks eligibility,
# holds or budgets, and no trigger runs: it measures the rows alone. It
# prints pgbench's latency and the executor time per cycle from
# pg_stat_statements, which the server must preload.
set -euo pipefail
dsn=${1:?usage: run.sh DSN}
dir=$(cd "$(dirname "$0")" && pwd)
for shape in today merged; do
  psql -q "$dsn" -f "$dir/schema.sql" >/dev/null 2>&1
  psql -Atq "$dsn" -c "SELECT pg_stat_statements_reset()" >/dev/null
  echo "$shape: $(pgbench -n -T 8 -f "$dir/$shape.sql" "$dsn" 2>&1 | grep 'latency average')"
  psql -Atq "$dsn" -c "SELECT round((sum(total_exec_time) / max(calls))::numeric / 64 * 1000, 1) || ' µs of executor time per cycle' FROM pg_stat_statements WHERE query LIKE '%proto.%' AND calls > 10"
done
psql -q "$dsn" -c "DROP SCHEMA proto CASCADE" >/dev/null 2>&1
