package bmdb

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A statement with named parameters is rewritten once to positional ones,
// each name a number wherever it appears; the values come in that order,
// and a parameter without an argument is an error, not a NULL.
func TestPositionalQueries(t *testing.T) {
	var c positionalQueries
	sql := `SELECT @b, @a, '@notaparam', @b -- @comment`
	args := pgx.NamedArgs{"a": 1, "b": "two", "unused": 3}
	q, err := c.get(sql, args)
	if err != nil {
		t.Fatal(err)
	}
	if want := `SELECT $1, $2, '@notaparam', $1 -- @comment`; q.sql != want {
		t.Errorf("rewritten: %q, want %q", q.sql, want)
	}
	if got := q.args(args); !slices.Equal(got, []any{"two", 1}) {
		t.Errorf("args: %v, want [two 1]", got)
	}
	if again, _ := c.get(sql, args); again != q {
		t.Errorf("a second get rewrote the statement again")
	}
	if _, err := c.get(`SELECT @a, @missing`, pgx.NamedArgs{"a": 1}); err == nil {
		t.Errorf("a parameter without an argument: no error")
	}
}
