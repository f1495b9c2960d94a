package shepherdcli

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/tcpproxy"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// auditLeases proves from history order, with the shared auditor, that no
// two leases of one exclusion group (AgentStart and Recovery share one)
// overlapped on a machine, and that every lease ended. It returns the
// number of leases.
func auditLeases(t *testing.T, history []bmdb.HistoryEntry) int {
	t.Helper()
	return bmdbtest.CheckLeases(t, history, bmdbtest.GroupsOf(agentstart.Process, recovery.Process))
}

// newTCPProxy puts a controllable TCP proxy (internal/tcpproxy) in front
// of target for the test's lifetime: Cut makes the target unreachable
// without giving up the port, Restore brings it back.
func newTCPProxy(t *testing.T, target string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// testPassword is put into DSNs so that tests can check that no log shows it.
const testPassword = "s3cret-test-password"

// viaProxy returns dsn rerouted through a new proxy to its server.
func viaProxy(t *testing.T, dsn string) (string, *tcpproxy.Proxy) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal("cannot parse the test DSN")
	}
	proxy := newTCPProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = proxy.Addr()
		if _, hasPassword := u.User.Password(); !hasPassword && bmdbtest.Cluster() != nil {
			// The private cluster trusts local connections and never asks
			// for it: a password that lets tests check it is never logged.
			u.User = url.UserPassword(u.User.Username(), testPassword)
		}
		return u.String(), proxy
	}
	// key=value: later keys override earlier ones.
	return dsn + " host=" + host + " port=" + port, proxy
}

// logClaimStateOnFailure logs, if t fails, what decides claims in the BMDB
// at dsn (due rows, leases, backoffs, history, agents, registrations): a
// test that waited in vain for a claim says why.
func logClaimStateOnFailure(t *testing.T, dsn string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("claim state: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{
			`SELECT 'due', process, machine_id::text, due_at::text FROM work_due ORDER BY due_at`,
			`SELECT 'lease', process, machine_id::text, session_id::text FROM work`,
			`SELECT 'backoff', process, machine_id::text, until::text FROM work_backoff`,
			`SELECT 'history', process, machine_id::text, event || ' ' || coalesce(failed_cause, '') FROM work_history ORDER BY id`,
			`SELECT 'agent', '', machine_id::text, agent_started_at::text FROM machine_agent_started`,
			`SELECT 'registry', process, array_to_string(watches, ','), fingerprint FROM process_registry`,
		} {
			rows, err := conn.Query(ctx, q)
			if err != nil {
				t.Logf("claim state: %s: %v", q, err)
				continue
			}
			for rows.Next() {
				var kind, process, machine, detail string
				if err := rows.Scan(&kind, &process, &machine, &detail); err == nil {
					t.Logf("claim state: %s %s %s %s", kind, process, machine, detail)
				}
			}
			rows.Close()
		}
	})
}
