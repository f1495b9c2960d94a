package bmdb

import "context"

// Setting reads a server setting inside the transaction, for ha_test.go,
// which checks that every framework transaction sets its timeouts.
func (t *Tx) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := t.tx.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}

// PreparedLike counts the statements prepared on the transaction's server
// connection whose text contains fragment, for statements_test.go.
func (t *Tx) PreparedLike(ctx context.Context, fragment string) (int, error) {
	var n int
	err := t.tx.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE strpos(statement, $1) > 0", fragment).Scan(&n)
	return n, err
}

// DeallocateAll drops the prepared statements of the transaction's server
// connection, as a transaction-mode pooler that moved the client to
// another server connection would.
func (t *Tx) DeallocateAll(ctx context.Context) error {
	_, err := t.tx.Exec(ctx, "DEALLOCATE ALL")
	return err
}

// StatementsPrepared reports whether db's new connections prepare their
// statements.
func StatementsPrepared(db *DB) bool { return db.statements.state.Load() == statementsPrepared }
