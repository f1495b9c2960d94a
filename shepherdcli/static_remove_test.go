package shepherdcli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// tarpit accepts TCP connections and says nothing on them until closed:
// an SSH login to it waits for the server's banner, so AgentStart holds
// its lease of a machine listed there for as long as the test likes.
type tarpit struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startTarpit(t *testing.T) *tarpit {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tarpit{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tp.mu.Lock()
			tp.conns = append(tp.conns, c)
			tp.mu.Unlock()
		}
	}()
	t.Cleanup(func() { ln.Close(); tp.drop() })
	return tp
}

func (tp *tarpit) port() int { return tp.ln.Addr().(*net.TCPAddr).Port }

// drop closes the connections held: the logins on them fail at once.
func (tp *tarpit) drop() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, c := range tp.conns {
		c.Close()
	}
	tp.conns = nil
}

// closedPort is a local port nothing listens on: a login there is refused.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// TestStaticRemovesMachines runs shepherd -provider static with AgentStart
// over three machines: idle reaches nothing (its start fails, and backs
// off for an hour), busy is a tarpit that keeps AgentStart's lease, and
// stays stays listed. The inventory then loses idle and busy, and SIGHUP
// reloads it: idle is removed at once; busy is kept while leased, and
// removed by the provider once the lease ends. Both removals are Removed
// events in the history, which 'shepherd history' (by UUID or by the
// provider id the machine had) and the status page still show for the
// removed machines, and no removal fell inside a lease.
func TestStaticRemovesMachines(t *testing.T) {
	t.Parallel()
	dir, keyFile, agent := staticProviderFiles(t, "#!/bin/sh\nexit 1\n")
	pit := startTarpit(t)
	inventory := filepath.Join(dir, "inventory.yaml")
	entry := func(id string, port int) string {
		return fmt.Sprintf("  - id: %s\n    ssh:\n      address: 127.0.0.1\n      port: %d\n", id, port)
	}
	head := "defaults:\n  ssh:\n    user: root\nmachines:\n"
	stays := entry("stays", closedPort(t))
	writeFile(t, inventory, head+entry("idle", closedPort(t))+entry("busy", pit.port())+stays)

	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn),
		staticFlags(inventory, keyFile, agent,
			"-processes=agentstart",
			"-agent_ssh_connect_timeout=5m",
			"-agentstart_backoff_initial=1h",
			"-agentstart_backoff_maximum=1h",
		)...)
	var idle, busy uuid.UUID
	bmdbtest.WaitFor(t, 60*time.Second, "idle's start failed and busy's lease held", func() (bool, string) {
		got := staticMachines(t, db)
		idle, busy = got["idle"].Machine, got["busy"].Machine
		if idle == uuid.Nil || busy == uuid.Nil {
			return false, fmt.Sprintf("machines: %v", got)
		}
		hi, err := db.History(t.Context(), idle)
		if err != nil {
			t.Fatal(err)
		}
		hb, err := db.History(t.Context(), busy)
		if err != nil {
			t.Fatal(err)
		}
		return countEvents(hi, agentstart.Process.Name, bmdb.EventFailed) == 1 &&
				countEvents(hb, agentstart.Process.Name, bmdb.EventStarted) == 1 && len(hb) == 1,
			fmt.Sprintf("idle: %v; busy: %v", hi, hb)
	})

	replaceFile(t, inventory, head+stays)
	d.Signal(syscall.SIGHUP)
	bmdbtest.WaitFor(t, 20*time.Second, "idle removed, busy kept while leased", func() (bool, string) {
		m, _ := d.Metrics()
		removed, kept := m.Value("shepherd_inventory_machines_removed_total"), m.Value("shepherd_inventory_removed_machines")
		return removed == 1 && kept == 1 && d.LogCount("are kept while leased") > 0,
			fmt.Sprintf("removed_total %g, removed_machines %g", removed, kept)
	})
	got := staticMachines(t, db)
	if _, ok := got["idle"]; ok || got["busy"].Machine != busy || len(got) != 2 {
		t.Fatalf("machines after the reload: %v, want stays and busy (leased)", got)
	}
	if h, _ := db.History(t.Context(), busy); len(h) != 1 || h[0].Event != bmdb.EventStarted {
		t.Fatalf("busy's history while leased: %+v, want its Started only", h)
	}

	// The login on the tarpit fails: the lease ends, and the provider
	// removes busy at its next try.
	pit.drop()
	bmdbtest.WaitFor(t, 60*time.Second, "busy removed after its lease", func() (bool, string) {
		pit.drop() // a login retried meanwhile
		m, _ := d.Metrics()
		removed, kept := m.Value("shepherd_inventory_machines_removed_total"), m.Value("shepherd_inventory_removed_machines")
		return removed == 2 && kept == 0, fmt.Sprintf("removed_total %g, removed_machines %g", removed, kept)
	})
	if got := staticMachines(t, db); len(got) != 1 {
		t.Errorf("machines at the end: %v, want stays only", got)
	}

	for name, m := range map[string]uuid.UUID{"idle": idle, "busy": busy} {
		h, err := db.History(t.Context(), m)
		if err != nil {
			t.Fatal(err)
		}
		last := h[len(h)-1]
		if last.Event != bmdb.EventRemoved || !strings.HasPrefix(last.Cause, "static/"+name+": no longer listed in the inventory ") {
			t.Errorf("%s's last event %+v, want Removed naming it and the file", name, last)
		}
		var actor string
		if err := db.Transact(t.Context(), func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.QueryRow(ctx, `SELECT actor FROM work_history WHERE id = $1`, last.ID).Scan(&actor)
		}); err != nil || actor != "provider:static" {
			t.Errorf("%s's Removed actor %q (%v), want provider:static", name, actor, err)
		}

		// The removed machine's history, through the binary's CLI and the
		// status page.
		code, out, errOut := runShepherd(t, replicatest.EnvWithoutDSN(), "history", m.String(), "-bmdb_dsn", dsn)
		if code != 0 || !strings.Contains(out, "Removed") || !strings.Contains(out, "ShepherdAgentStart") || !strings.Contains(out, "static/"+name) {
			t.Errorf("shepherd history %s (%s): exit %d\n%s%s", m, name, code, out, errOut)
		}
		// By the provider id it had, too.
		code, out, errOut = runShepherd(t, replicatest.EnvWithoutDSN(), "history", name, "-bmdb_dsn", dsn)
		if code != 0 || !strings.Contains(out, "Removed") || !strings.Contains(out, "static/"+name) {
			t.Errorf("shepherd history %s: exit %d\n%s%s", name, code, out, errOut)
		}
		status, body, err := d.Get("/status/machine/" + m.String())
		if err != nil || status != http.StatusOK || !strings.Contains(body, "Removed") || !strings.Contains(body, "static/"+name) {
			t.Errorf("status page of the removed %s: %d %v\n%s", name, status, err, body)
		}
	}
	d.StopClean(20 * time.Second)
	bmdbtest.CheckLeases(t, bmdbtest.History(t, db), bmdbtest.GroupsOf(agentstart.Process, recovery.Process))
}
