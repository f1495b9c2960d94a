package bmdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// escapeEString closes the parenthesis it is spliced into, as PostgreSQL
// reads it: its first four characters are one string (a quote), so
// ") OR true OR (" is structure. A lexer that skips only doubled quotes
// reads the whole text as two string literals, balanced.
const escapeEString = `E'\'' = '' ) OR true OR ( '' = E'\''`

// lexCases are conditions whose literals, comments or quoting decide where
// the condition ends; want is the refusal ("" for a condition to accept).
var lexCases = []struct {
	sql, want string
}{
	{escapeEString, "escape strings"},
	{`e'x' = 'x'`, "escape strings"},
	{`m.machine_id IS NOT NULL AND 1e'x' IS NULL`, "escape strings"},
	{`1.5E'\') OR (true' IS NULL`, "escape strings"},
	// A plain string with a backslash: its end depends on
	// standard_conforming_strings.
	{`'\'' = '' ) OR true OR ( '' = '\''`, "backslash"},
	{`'a\b' = 'a'`, "backslash"},
	{`U&'\0041' = 'A'`, "unicode-escape"},
	{`u&"m".machine_id IS NOT NULL`, "unicode-escape"},
	{`1U&'x' IS NULL`, "unicode-escape"},
	{`$$) OR (true$$ IS NULL`, "'$'"},
	{`$tag$ ) $tag$ IS NULL`, "'$'"},
	{`m.machine_id = $1`, "'$'"},
	{`a$b IS NULL`, "'$'"},
	{`true /* /* */ ) OR (true */`, "comments (/*)"},
	{`true -- ) OR (true`, "comments (--)"},
	{`true OR m.machine_id::text <>-- x` + "\n" + `'x'`, "comments (--)"},
	{"true\x00", "NUL"},
	{`"m"".x" IS NULL) OR ("y"`, "closes more"},
	{`"unterminated`, "unterminated"},

	// Accepted: what looks like a prefix but is part of a word, and
	// quoting whose end is certain.
	{`date'2024-01-01' < now()`, ""},
	{`m.machine_id::text <> ')' AND "m".machine_id IS NOT NULL`, ""},
	{`'it''s' <> ') OR (true'`, ""},
	{`"we""ird" IS NULL OR true`, ""},
	{`type'x' IS NULL`, ""},
	{`B'0101' = X'5'`, ""},
	{`N'x' = 'x'`, ""},
	{`'a' || '/*DUE*/' <> 'b'`, ""},
	{`E IS NULL`, ""},
	{`"E"'x' IS NULL`, ""},
	{`m.e <> 'x'`, ""},
	{`U & 1 = 0`, ""},
}

// The lexer that keeps a condition inside its parentheses finds each
// literal's end where PostgreSQL does, or refuses the literal: escape
// strings (E'...', whose \' the old lexer took for the end), backslashes
// in plain strings, Unicode-escape quoting (U&'...'), dollar quotes,
// nested and line comments.
func TestCheckBalancedLexesLikePostgres(t *testing.T) {
	for _, tc := range lexCases {
		_, err := bmdb.NewCandidates(bmdb.Condition{Name: "lex", SQL: tc.sql})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("NewCandidates(%q) = %v, want it accepted", tc.sql, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("NewCandidates(%q) = %v, want an error with %q", tc.sql, err, tc.want)
		}
		// The due time is checked by the same rules.
		_, derr := bmdb.NewCandidates(bmdb.Condition{Name: "lex", SQL: "true", Due: tc.sql})
		if (derr == nil) != (err == nil) {
			t.Errorf("Due %q: %v, but as SQL: %v", tc.sql, derr, err)
		}
	}
}

// FuzzConditionStaysInside checks, against PostgreSQL itself, that no
// condition NewCandidates accepts leaves the parentheses it is spliced
// into: "false AND (condition)" selects nothing, or PostgreSQL refuses
// it, with standard_conforming_strings on and off. The planner folds
// "false AND ..." away, so an accepted condition is parsed, never run.
func FuzzConditionStaysInside(f *testing.F) {
	for _, tc := range lexCases {
		f.Add(tc.sql)
	}
	f.Add(`true) OR (true`)
	f.Add(`'x' = 'x'`)
	e := newEnv(f, bmdb.Options{})
	// The oracle sees an escape: the ones the old lexer let through.
	for _, c := range []struct{ scs, cond string }{
		{"on", escapeEString},
		{"off", `'\'' = '' ) OR true OR ( '' = '\''`},
	} {
		if n, err := spliced(context.Background(), e.raw, c.scs, c.cond); n != 1 {
			f.Fatalf("the oracle on %q (standard_conforming_strings %s): %d rows, %v; want the escape's 1", c.cond, c.scs, n, err)
		}
	}
	f.Fuzz(func(t *testing.T, cond string) {
		if _, err := bmdb.NewCandidates(bmdb.Condition{Name: "fuzz", SQL: cond}); err != nil {
			return
		}
		for _, scs := range []string{"on", "off"} {
			if n, err := spliced(t.Context(), e.raw, scs, cond); n != 0 {
				t.Fatalf("accepted condition %q selects %d rows from false AND (condition) with standard_conforming_strings %s (%v)", cond, n, scs, err)
			}
		}
	})
}

// spliced counts the rows of "false AND (cond)" in a read-only
// transaction, parsed afresh (a cached statement keeps the reading of
// standard_conforming_strings it was prepared under); an error PostgreSQL raises while parsing counts 0, a
// timeout (the condition ran) -1.
func spliced(ctx context.Context, pool *pgxpool.Pool, scs, cond string) (int, error) {
	var n int
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('standard_conforming_strings', $1, true), set_config('statement_timeout', '10s', true)`, scs); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM (VALUES (NULL::uuid)) m(machine_id) WHERE false AND (`+cond+`)`, pgx.QueryExecModeExec).Scan(&n)
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return n, nil
	case errors.As(err, &pgErr) && pgErr.Code == "57014", errors.Is(err, context.DeadlineExceeded):
		return -1, err
	case errors.As(err, &pgErr):
		return 0, err
	}
	return -1, err
}
