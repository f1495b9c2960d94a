package bmdbtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connecting to %s: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Parallel tests each get a migrated database of their own: what one writes,
// no other sees. The connections are left open on purpose: the cleanup's
// DROP DATABASE ... WITH (FORCE) must cope.
func TestNewDatabaseParallel(t *testing.T) {
	for _, name := range []string{"a", "b", "c", "d", "e", "f"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			conn := connect(t, NewDatabase(t))
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM machines").Scan(&n); err != nil {
				t.Fatalf("the database is not migrated: %v", err)
			}
			if n != 0 {
				t.Fatalf("a fresh database has %d machines, want 0", n)
			}
			if _, err := conn.Exec(ctx, "INSERT INTO machines DEFAULT VALUES"); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM machines").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("after one insert: %d machines, want 1 (databases are shared?)", n)
			}
		})
	}
}

func TestNewEmptyDatabase(t *testing.T) {
	conn := connect(t, NewEmptyDatabase(t))
	var n int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the empty database has %d tables", n)
	}
}

// The database is gone once the test that made it has ended.
func TestDatabaseDropped(t *testing.T) {
	var name string
	t.Run("make", func(t *testing.T) {
		conn := connect(t, NewDatabase(t))
		if err := conn.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	var exists bool
	admin := connect(t, adminDSN)
	if err := admin.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestDatabaseName(t *testing.T) {
	long := "TestSomething/with a very long subtest name, punctuation & UPPER case: " + strings.Repeat("x", 100)
	name := databaseName(long)
	if len(name) > 63 {
		t.Errorf("databaseName is %d bytes, PostgreSQL keeps 63: %s", len(name), name)
	}
	if strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		t.Errorf("databaseName %q has characters that need quoting", name)
	}
	// Two calls, which must differ: each takes the next sequence number.
	if first, second := databaseName("T"), databaseName("T"); first == second {
		t.Error("databaseName repeats")
	}
}

func TestDSNDeriver(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:p@db.example:5433/shepherd?sslmode=require", "postgres://u:p@db.example:5433/other?sslmode=require"},
		{"postgresql://u@db.example/", "postgresql://u@db.example/other"},
		{"host=db.example user=u dbname=shepherd", "host=db.example user=u dbname=shepherd dbname='other'"},
	} {
		derive, err := dsnDeriver(tc.dsn)
		if err != nil {
			t.Errorf("dsnDeriver(%q): %v", tc.dsn, err)
			continue
		}
		got := derive("other")
		if got != tc.want {
			t.Errorf("dsnDeriver(%q)(other) = %q, want %q", tc.dsn, got, tc.want)
		}
		cfg, err := pgx.ParseConfig(got)
		if err != nil {
			t.Errorf("derived DSN %q does not parse: %v", got, err)
		} else if cfg.Database != "other" {
			t.Errorf("derived DSN %q names database %q, want other", got, cfg.Database)
		}
	}
	if _, err := dsnDeriver("postgres://u:secret@[bad"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("dsnDeriver of a bad DSN: %v (want an error without the password)", err)
	}
}

func TestCluster(t *testing.T) {
	if Cluster() == nil {
		t.Skip("running against " + EnvDSN + ": no private cluster")
	}
	conn := connect(t, Cluster().DSN("postgres"))
	if err := conn.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}
