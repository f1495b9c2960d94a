package bmdb

import "context"

// Setting reads a server setting inside the transaction, for ha_test.go,
// which checks that every framework transaction sets its timeouts.
func (t *Tx) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := t.tx.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}
