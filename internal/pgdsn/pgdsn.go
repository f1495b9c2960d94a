// Package pgdsn names a PostgreSQL DSN's server and database for logs and
// messages, shared by the daemon and its command line: never the password,
// nor the user.
package pgdsn

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
)

// Describe names the server and database of dsn as host:port/database. Its
// error never quotes dsn, which may hold a password.
func Describe(dsn string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// A TLS file the DSN names (sslrootcert, sslcert, sslkey) that
		// cannot be read is no malformed DSN: say which file.
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			return "", fmt.Errorf("a TLS file the DSN names cannot be read: %w", pathErr)
		}
		// pgx's parse errors may quote the DSN, password included.
		return "", errors.New("not a valid PostgreSQL URL or key=value DSN")
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database), nil
}
