package shepherdcli

import (
	"flag"
	"os"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/pgdsn"
)

// envDSN names the environment variable that gives the BMDB DSN when no flag
// does. An environment variable (or a file) keeps the password out of the
// process list, where a flag would show it.
const envDSN = "SHEPHERD_BMDB_DSN"

// dsnFlags are the ways to name the BMDB, shared by the daemon and migrate.
type dsnFlags struct {
	dsn  string
	file string
	// dsnGiven says -bmdb_dsn was on the command line, even as "".
	dsnGiven bool
}

func (d *dsnFlags) register(fs *flag.FlagSet) {
	fs.Func("bmdb_dsn", "PostgreSQL DSN of the BMDB (URL or key=value); default $"+envDSN+". Without connect_timeout, each host gets "+bmdb.DefaultConnectTimeout.String()+" to answer; see docs/high-availability.md for replicated databases and PgBouncer", func(v string) error {
		d.dsn, d.dsnGiven = v, true
		return nil
	})
	fs.StringVar(&d.file, "bmdb_dsn_file", "", "file holding the BMDB DSN (e.g. a mounted secret); an alternative to -bmdb_dsn")
}

// resolve returns the DSN from -bmdb_dsn, -bmdb_dsn_file or the environment,
// in that order, and "" when none gives one. A DSN that does not parse is a
// usage error; its text is never echoed, since it may hold a password.
//
// A DSN given but empty (-bmdb_dsn "" or $SHEPHERD_BMDB_DSN set to "", as a
// deployment template does with a secret that did not arrive) is a usage
// error too, not "none": none means demo mode, a private database that no
// other replica shares.
func (d *dsnFlags) resolve() (string, error) {
	var dsn, from string
	switch {
	case d.dsnGiven && d.file != "":
		return "", usagef("-bmdb_dsn and -bmdb_dsn_file: give only one")
	case d.dsnGiven:
		dsn, from = strings.TrimSpace(d.dsn), "-bmdb_dsn"
		if dsn == "" {
			return "", usagef("-bmdb_dsn is empty: give the BMDB's DSN, or no -bmdb_dsn at all for demo mode")
		}
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
		env, set := os.LookupEnv(envDSN)
		dsn, from = strings.TrimSpace(env), "$"+envDSN
		if set && dsn == "" {
			return "", usagef("$%s is set but empty: give the BMDB's DSN in it, or unset it for demo mode", envDSN)
		}
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
func describeDSN(dsn string) (string, error) { return pgdsn.Describe(dsn) }
