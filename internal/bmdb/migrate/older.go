package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shepherd-fleet/shepherd/untrusted"
)

// OlderSession is a live session of a binary whose schema is older than
// this binary's: one that records no schema version with its process
// (a binary before migration 0033, which added the column) or an older
// one. During a rolling upgrade
// such a replica does not know the gates that newer migrations add; the
// database binds it to holds and budgets (migration 0033), and binaries
// that ignore cancel requests refuse to start, but one already running
// goes on ignoring them until it is replaced.
type OlderSession struct {
	Component   string
	RuntimeInfo string
	// Schema is the version the session's binary recorded, 0 when it
	// recorded none (a binary before migration 0033).
	Schema int
}

// String names the session for a warning: component, where it runs and
// its schema, with the text its owner wrote bounded and stripped of
// control characters.
func (s OlderSession) String() string {
	schema := "schema not recorded"
	if s.Schema > 0 {
		schema = fmt.Sprintf("schema %d", s.Schema)
	}
	return fmt.Sprintf("%s (%s, %s)", untrusted.Line(s.Component, 80), untrusted.Line(s.RuntimeInfo, 120), schema)
}

// maxOlderSessions bounds the sessions a warning names.
const maxOlderSessions = 10

// OlderSessions lists up to ten live sessions of binaries of an older
// schema than this one's, and how many there are in all.
func OlderSessions(ctx context.Context, db *bmdb.DB) ([]OlderSession, int, error) {
	return olderSessions(ctx, db.Pool())
}

// OlderSessionsAt is OlderSessions on a database named by dsn, for
// 'migrate up', which has no pool.
func OlderSessionsAt(ctx context.Context, dsn string) ([]OlderSession, int, error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return olderSessions(ctx, conn)
}

func olderSessions(ctx context.Context, q bmdb.Queryer) ([]OlderSession, int, error) {
	type row struct {
		Component, RuntimeInfo string
		Schema                 int32
		Total                  int64
	}
	rows, err := bmdb.QueryRows(ctx, q, pgx.RowToStructByPos[row], qOlderSessions, int32(core.Latest()), maxOlderSessions)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" {
		// No schema_version column: the schema is older than this binary.
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("looking for live sessions of older binaries: %w", err)
	}
	out := make([]OlderSession, len(rows))
	total := 0
	for i, r := range rows {
		out[i] = OlderSession{Component: r.Component, RuntimeInfo: r.RuntimeInfo, Schema: int(r.Schema)}
		total = int(r.Total)
	}
	return out, total, nil
}

// OlderSessionsWarning is the warning 'migrate up', 'hold' and 'cancel'
// print while sessions of older binaries are live ("" when none is):
// what such a replica still ignores, and which ones they are.
func OlderSessionsWarning(sessions []OlderSession, total int) string {
	if total == 0 {
		return ""
	}
	names := make([]string, len(sessions))
	for i, s := range sessions {
		names[i] = s.String()
	}
	more := ""
	if total > len(sessions) {
		more = fmt.Sprintf(" and %d more", total-len(sessions))
	}
	return fmt.Sprintf("warning: %d live session(s) of binaries of a schema older than %d: %s%s; "+
		"the database keeps them off held machines and machines whose budget is spent, but a replica before schema 18 "+
		"that was running before the upgrade ignores cancel requests until it is replaced: finish the rollout (docs/upgrading.md)",
		total, core.Latest(), strings.Join(names, "; "), more)
}
