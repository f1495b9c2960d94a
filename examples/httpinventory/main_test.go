package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/shepherdcli/shepherdclitest"

	"example.com/httpinventory/httpinv"
)

// The binary's tests run against a real PostgreSQL, as Shepherd's do.
func TestMain(m *testing.M) { bmdbtest.Main(m) }

// recoveredRE matches a Recovered event in 'history' (not NotRecovered).
var recoveredRE = regexp.MustCompile(`(?m)(^|\s)Recovered(\s|$)`)

// inventory is an HTTP inventory whose machines the test changes.
type inventory struct {
	mu       sync.Mutex
	machines []httpinv.Machine
	body     string // served instead of machines when set
}

func (inv *inventory) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if inv.body != "" {
		_, _ = io.WriteString(w, inv.body)
		return
	}
	_ = json.NewEncoder(w).Encode(inv.machines)
}

func (inv *inventory) set(ms []httpinv.Machine, body string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.machines, inv.body = ms, body
}

// The example's binary with its provider of its own: the machines of an
// HTTP inventory become machines in the BMDB, AgentStart starts simulated
// agents on them, which heartbeat; a broken inventory changes nothing; a
// machine the inventory stops listing is removed, gone from 'machines'
// and with Removed last in its history; and after a restart, whose
// simulated agents died with the previous process, Recovery reboots the
// machines through the simulated agents and AgentStart starts new ones.
func TestInventoryd(t *testing.T) {
	t.Parallel()
	bin := shepherdclitest.Build(t, ".", "inventoryd")
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	dsnFlag := "-bmdb_dsn=" + dsn

	inv := &inventory{machines: []httpinv.Machine{
		{ID: "rack1-node1", Address: "10.0.1.1", Location: "rack1"},
		{ID: "rack1-node2", Address: "10.0.1.2", Location: "rack1"},
		{ID: "rack2-node1", Address: "10.0.2.1", Location: "rack2"},
	}}
	srv := httptest.NewServer(inv)
	defer srv.Close()

	// The URL is required; the provider is the binary's default.
	code, _, errOut := bin.Run(t, dsnFlag, "-listen=127.0.0.1:0")
	if want := "-httpinventory_url: required"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("inventoryd without -httpinventory_url: exit %d, stderr %q; want 2 and %q", code, errOut, want)
	}

	// No simulated agent start fails and none dies, so that every machine
	// heartbeats soon.
	common := []string{dsnFlag, "-listen=127.0.0.1:0", "-httpinventory_url=" + srv.URL, "-httpinventory_poll=200ms",
		"-httpinventory_agent_start_failure_rate=0", "-httpinventory_heartbeat_loss_rate=0",
		"-httpinventory_heartbeat_interval=200ms", "-httpinventory_action_time=10ms",
		"-agentstart_idle_poll=100ms", "-recovery_idle_poll=100ms"}
	d := bin.Start(t, common...)
	heartbeating := func(ids ...string) func() bool {
		return func() bool {
			ms := bmdbtest.ProvidedBy(t, db, httpinv.Name)
			for _, id := range ids {
				m, ok := ms[id]
				if !ok || bmdbtest.LastHeartbeat(t, db, m.Machine).IsZero() {
					return false
				}
			}
			return true
		}
	}
	d.WaitFor(t, 2*time.Minute, "a heartbeat of every inventory machine's agent", heartbeating("rack1-node1", "rack1-node2", "rack2-node1"))
	code, out, errOut := bin.Run(t, "machines", "-all", dsnFlag)
	if code != 0 || strings.Count(out, "httpinventory") != 3 {
		t.Errorf("machines -all: exit %d, want the 3 inventory machines\n%s%s", code, out, errOut)
	}

	// A broken answer (here, a machine without an id) is refused: nothing
	// is removed.
	inv.set(nil, `[{"address": "10.0.9.9"}]`)
	d.WaitFor(t, time.Minute, "the broken inventory's error in the log", func() bool {
		return strings.Contains(d.Log(), "machine 0 has no id")
	})
	if n := len(bmdbtest.ProvidedBy(t, db, httpinv.Name)); n != 3 {
		t.Errorf("%d machines after a broken inventory, want 3", n)
	}

	// One machine leaves the inventory, one joins.
	removed := bmdbtest.ProvidedBy(t, db, httpinv.Name)["rack1-node2"]
	inv.set([]httpinv.Machine{
		{ID: "rack1-node1", Address: "10.0.1.1", Location: "rack1"},
		{ID: "rack2-node1", Address: "10.0.2.1", Location: "rack2"},
		{ID: "rack2-node2", Address: "10.0.2.2", Location: "rack2"},
	}, "")
	d.WaitFor(t, 2*time.Minute, "the removal of rack1-node2 and an agent on rack2-node2", func() bool {
		_, present := bmdbtest.ProvidedBy(t, db, httpinv.Name)["rack1-node2"]
		return !present && heartbeating("rack2-node2")()
	})
	code, out, errOut = bin.Run(t, "machines", "-all", dsnFlag)
	if code != 0 || strings.Contains(out, removed.Machine.String()) || strings.Count(out, "httpinventory") != 3 {
		t.Errorf("machines -all after the removal: exit %d, want 3 machines without %s\n%s%s", code, removed.Machine, out, errOut)
	}
	code, out, errOut = bin.Run(t, "history", removed.Machine.String(), dsnFlag)
	if code != 0 || !strings.Contains(out, string(bmdb.EventRemoved)) || !strings.Contains(out, "no longer listed in the inventory") {
		t.Errorf("history of the removed machine: exit %d, want its Removed event\n%s%s", code, out, errOut)
	}
	d.Stop()

	// The agents died with the process. The next one's Recovery finds
	// their heartbeats stale and reboots the machines through the
	// simulated agents; AgentStart starts new agents, whose heartbeats,
	// with new boot identities, verify the reboots.
	d = bin.Start(t, append(common, "-recovery_heartbeat_timeout=2s")...)
	d.WaitFor(t, 2*time.Minute, "Recovery of every inventory machine", func() bool {
		return d.Metric(t, `shepherd_work_finished_total{process="recovery",result="finished"}`) >= 3
	})
	node1 := bmdbtest.ProvidedBy(t, db, httpinv.Name)["rack1-node1"].Machine.String()
	d.WaitFor(t, 2*time.Minute, "rack1-node1's reboot verified by its new agent's heartbeat", func() bool {
		code, out, _ := bin.Run(t, "history", node1, dsnFlag)
		return code == 0 && recoveredRE.MatchString(out)
	})
	if testing.Verbose() {
		_, out, _ := bin.Run(t, "history", node1, dsnFlag)
		t.Logf("history of rack1-node1:\n%s", out)
	}
}
