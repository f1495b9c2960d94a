package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// envDSN names the environment variable that gives the BMDB DSN when no flag
// does. An environment variable (or a file) keeps the password out of the
// process list, where a flag would show it.
const envDSN = "SHEPHERD_BMDB_DSN"

// dsnFlags are the ways to name the BMDB, shared by the daemon and migrate.
type dsnFlags struct {
	dsn  string
	file string
}

func (d *dsnFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.dsn, "bmdb_dsn", "", "PostgreSQL DSN of the BMDB (URL or key=value); default $"+envDSN+". Without connect_timeout, each host gets "+bmdb.DefaultConnectTimeout.String()+" to answer; see docs/high-availability.md for replicated databases and PgBouncer")
	fs.StringVar(&d.file, "bmdb_dsn_file", "", "file holding the BMDB DSN (e.g. a mounted secret); an alternative to -bmdb_dsn")
}

// resolve returns the DSN from -bmdb_dsn, -bmdb_dsn_file or the environment,
// in that order, and "" when none gives one. A DSN that does not parse is a
// usage error; its text is never echoed, since it may hold a password.
func (d *dsnFlags) resolve() (string, error) {
	var dsn, from string
	switch {
	case d.dsn != "" && d.file != "":
		return "", usagef("-bmdb_dsn and -bmdb_dsn_file: give only one")
	case d.dsn != "":
		dsn, from = d.dsn, "-bmdb_dsn"
	case d.file != "":
		b, err := os.ReadFile(d.file)
		if err != nil {
			return "", usagef("-bmdb_dsn_file: %v", err)
		}
		dsn, from = strings.TrimSpace(string(b)), "-bmdb_dsn_file "+d.file
		if dsn == "" {
			return "", usagef("-bmdb_dsn_file %s: the file is empty", d.file)
		}
	default:
		dsn, from = os.Getenv(envDSN), envDSN
	}
	if dsn == "" {
		return "", nil
	}
	if _, err := describeDSN(dsn); err != nil {
		return "", usagef("%s: %v", from, err)
	}
	return dsn, nil
}

// describeDSN names the server and database of dsn for logs, as
// host:port/database: never the password, nor the user.
func describeDSN(dsn string) (string, error) {
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
