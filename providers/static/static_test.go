package static

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
)

// testConfig returns a provider configuration for inventoryFile with a
// fresh client key and a placeholder agent binary.
func testConfig(t *testing.T, inventoryFile string) Config {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	sshdtest.WriteNewKey(t, keyFile)
	agent := filepath.Join(dir, "shepherd-agent")
	writeFiles(t, dir, map[string]string{"shepherd-agent": "#!/bin/sh\n"})
	cfg := DefaultConfig()
	cfg.InventoryFile = inventoryFile
	cfg.SSH.KeyFile = keyFile
	cfg.SSH.AgentBinary = agent
	cfg.SSH.HeartbeatURL = "http://127.0.0.1:1/heartbeat"
	if err := cfg.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return cfg
}

func openDB(t *testing.T) *bmdb.DB {
	t.Helper()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	return db
}

// provided returns the static provider's machines by provider id.
func provided(t *testing.T, db *bmdb.DB) map[string]bmdb.Provided {
	t.Helper()
	return bmdbtest.ProvidedBy(t, db, Name)
}

// The three inventories of the sync tests: a, b and c; then b changed, c
// gone and d new.
const (
	syncFirst = `
defaults: {ssh: {user: root}}
machines:
  - {id: a, ssh: {address: 10.0.0.1}, location: r1}
  - {id: b, ssh: {address: 10.0.0.2}}
  - {id: c, ssh: {address: 10.0.0.3}}
`
	syncSecond = `
defaults: {ssh: {user: root}}
machines:
  - {id: a, ssh: {address: 10.0.0.1}, location: r1}
  - {id: b, ssh: {address: 10.0.0.20, port: 2222}, location: r2}
  - {id: d, ssh: {address: 10.0.0.4}}
`
)

// startSync starts a provider over syncFirst, checks what it synced, and
// writes syncSecond for the test to reload.
func startSync(t *testing.T, db *bmdb.DB, configure func(*Config)) (*Provider, map[string]bmdb.Provided) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "inventory.yaml")
	writeFiles(t, dir, map[string]string{"inventory.yaml": syncFirst})
	cfg := testConfig(t, file)
	if configure != nil {
		configure(&cfg)
	}
	p, err := New(t.Context(), cfg, db.Public(), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	first := provided(t, db)
	if len(first) != 3 || first["a"].Address != "10.0.0.1:22" || first["a"].Location != "r1" {
		t.Fatalf("after start: %+v", first)
	}
	writeFiles(t, dir, map[string]string{"inventory.yaml": syncSecond})
	return p, first
}

// checkSecond checks the reload of syncSecond: a unchanged, b updated, d
// added, and c present in the BMDB as wantC says.
func checkSecond(t *testing.T, p *Provider, db *bmdb.DB, first map[string]bmdb.Provided, wantC bool) map[string]bmdb.Provided {
	t.Helper()
	second := provided(t, db)
	if _, ok := second["c"]; ok != wantC || len(second) != 3+map[bool]int{true: 1}[wantC] {
		t.Fatalf("after reload: %+v, want a, b, d and c: %v", second, wantC)
	}
	if second["a"] != first["a"] {
		t.Errorf("a changed: %+v -> %+v", first["a"], second["a"])
	}
	if b := second["b"]; b.Machine != first["b"].Machine || b.Address != "10.0.0.20:2222" || b.Location != "r2" {
		t.Errorf("b = %+v, want the same machine at 10.0.0.20:2222 in r2", b)
	}
	if wantC && second["c"] != first["c"] {
		t.Errorf("kept c was changed: %+v", second["c"])
	}
	if _, ok := p.Inventory().Machine("c"); ok {
		t.Error("c still in the inventory in force")
	}
	if got := value(t, p.metrics.machines); got != 3 {
		t.Errorf("shepherd_inventory_machines = %g, want 3", got)
	}
	return second
}

// checkRemoved checks that machine was removed and its history says so.
func checkRemoved(t *testing.T, db *bmdb.DB, machine uuid.UUID, providerID string) {
	t.Helper()
	d, err := operator.New(db).Machine(t.Context(), machine, 0)
	if err != nil {
		t.Fatalf("the removed %s's history: %v", providerID, err)
	}
	if d.Exists || len(d.History) == 0 {
		t.Fatalf("%s: exists %v, history %+v; want removed with a history", providerID, d.Exists, d.History)
	}
	last := d.History[len(d.History)-1]
	if last.Event != bmdb.EventRemoved || !strings.HasPrefix(last.Cause, "static/"+providerID+": no longer listed in the inventory ") {
		t.Errorf("%s's last event: %+v, want Removed with the provider id and the file", providerID, last)
	}
}

// A machine the inventory no longer lists is removed from the BMDB at the
// reload, its history kept; syncing the same file again changes nothing.
func TestSyncAddsUpdatesAndRemoves(t *testing.T) {
	ctx := t.Context()
	db := openDB(t)
	p, first := startSync(t, db, nil)
	if err := p.Reload(ctx); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	checkSecond(t, p, db, first, false)
	checkRemoved(t, db, first["c"].Machine, "c")
	if got := value(t, p.metrics.removals); got != 1 {
		t.Errorf("shepherd_inventory_machines_removed_total = %g, want 1", got)
	}
	if got := value(t, p.metrics.removed); got != 0 {
		t.Errorf("shepherd_inventory_removed_machines = %g, want 0", got)
	}
	res, err := Sync(ctx, db.Public(), p.Inventory(), SyncOptions{})
	if err != nil || len(res.Added)+len(res.Updated)+len(res.Removed)+len(res.Kept) != 0 {
		t.Fatalf("Sync again = %+v, %v; want no change", res, err)
	}
}

// With -inventory_keep_unlisted, an unlisted machine is kept, counted, and
// its actions fail with the long backoff.
func TestSyncKeepsUnlisted(t *testing.T) {
	ctx := t.Context()
	db := openDB(t)
	p, first := startSync(t, db, func(c *Config) { c.KeepUnlisted = true })
	if err := p.Reload(ctx); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	second := checkSecond(t, p, db, first, true)
	if got := value(t, p.metrics.removed); got != 1 {
		t.Errorf("shepherd_inventory_removed_machines = %g, want 1", got)
	}
	res, err := Sync(ctx, db.Public(), p.Inventory(), SyncOptions{KeepUnlisted: true})
	if err != nil || len(res.Added)+len(res.Updated)+len(res.Removed) != 0 || !slices.Equal(res.Kept, []string{"c"}) {
		t.Fatalf("Sync again = %+v, %v; want only c kept", res, err)
	}

	// Actions on the unlisted machine fail with the long backoff.
	_, err = p.StartAgent(ctx, second["c"])
	var be *backoff.Error
	if !errors.Is(err, ErrNotInInventory) || !errors.As(err, &be) || be.Backoff != RemovedBackoff {
		t.Fatalf("StartAgent on an unlisted machine: %v, want ErrNotInInventory with RemovedBackoff", err)
	}
	if err := p.Reboot(ctx, second["c"]); !errors.Is(err, ErrNotInInventory) {
		t.Fatalf("Reboot on an unlisted machine: %v", err)
	}
}

// An unlisted machine that a process holds a lease on is kept until the
// lease ends, and Run removes it then.
func TestSyncKeepsLeasedUntilLeaseEnds(t *testing.T) {
	ctx := t.Context()
	db := openDB(t)
	p, first := startSync(t, db, func(c *Config) { c.RemoveRetry = 50 * time.Millisecond })
	s, err := db.StartSession(ctx, bmdb.SessionConfig{Component: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	process := bmdb.Process{Name: "Test"}
	bmdbtest.Register(t, db, process, bmdb.ProvidedCandidates())
	var lease *bmdb.Lease
	for lease == nil || lease.Machine != first["c"].Machine {
		leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: process, Candidates: bmdb.ProvidedCandidates()})
		if err != nil {
			t.Fatalf("claiming c: %v", err)
		}
		lease = leases[0]
	}
	if err := p.Reload(ctx); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	checkSecond(t, p, db, first, true)
	if got := value(t, p.metrics.removed); got != 1 {
		t.Errorf("shepherd_inventory_removed_machines = %g while c is leased, want 1", got)
	}
	defer bmdbtest.Background(t, "Run", p.Run)()
	if err := lease.Finish(ctx, nil); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	bmdbtest.WaitFor(t, 20*time.Second, "c removed after its lease", func() (bool, string) {
		got := provided(t, db)
		_, ok := got["c"]
		return !ok, fmt.Sprintf("machines: %v", got)
	})
	checkRemoved(t, db, first["c"].Machine, "c")
}

func TestReloadKeepsLastGoodInventory(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "inventory.yaml")
	good := "- {id: a, ssh: {address: 10.0.0.1, user: root}}\n"
	writeFiles(t, dir, map[string]string{"inventory.yaml": good})
	p, err := New(ctx, testConfig(t, file), db.Public(), prometheus.NewRegistry())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	before := p.Inventory()

	// A bad file: one good new machine, one with an unknown field.
	writeFiles(t, dir, map[string]string{"inventory.yaml": good +
		"- {id: b, ssh: {address: 10.0.0.2, user: root}}\n" +
		"- {id: c, ssh: {address: 10.0.0.3, user: root, prot: 22}}\n"})
	err = p.Reload(ctx)
	var invErr *Error
	if !errors.As(err, &invErr) || !strings.Contains(err.Error(), "inventory.yaml:3: machines[2].ssh.prot: unknown field") {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if p.Inventory() != before {
		t.Fatal("a bad reload replaced the inventory")
	}
	if got := provided(t, db); len(got) != 1 {
		t.Fatalf("a bad reload changed the BMDB: %+v", got)
	}
	if got := value(t, p.metrics.lastReload); got != 0 {
		t.Errorf("shepherd_inventory_last_reload_successful = %g after a bad reload", got)
	}
	if got := value(t, p.metrics.reloads.WithLabelValues("error")); got != 1 {
		t.Errorf("reloads{error} = %g, want 1", got)
	}

	// A deleted file is no better.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(ctx); !errors.Is(err, os.ErrNotExist) || p.Inventory() != before {
		t.Fatalf("Reload of a missing file: %v", err)
	}

	// Fixed: taken.
	writeFiles(t, dir, map[string]string{"inventory.yaml": good + "- {id: b, ssh: {address: 10.0.0.2, user: root}}\n"})
	if err := p.Reload(ctx); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if _, ok := p.Inventory().Machine("b"); !ok || len(provided(t, db)) != 2 {
		t.Fatal("the fixed file was not taken")
	}
	if got := value(t, p.metrics.lastReload); got != 1 {
		t.Errorf("shepherd_inventory_last_reload_successful = %g after a good reload", got)
	}
}

func TestNewRejectsBadInventory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "inventory.yaml")
	writeFiles(t, dir, map[string]string{"inventory.yaml": "- {id: a, ssh: {address: 10.0.0.1, user: root}}\n"})
	cfg := testConfig(t, file)
	writeFiles(t, dir, map[string]string{"inventory.yaml": "- {id: a, ssh: {address: 10.0.0.1:22, user: root}}\n"})
	if err := cfg.Check(); err == nil || !strings.Contains(err.Error(), "-inventory: inventory "+file+" rejected: "+file+":1: machines[0].ssh.address") {
		t.Fatalf("Check: %v", err)
	}
	if _, err := New(context.Background(), cfg, openDB(t).Public(), nil); err == nil {
		t.Fatal("New accepted a bad inventory")
	}
}

func TestRebootThroughRedfish(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	bmc := redfishtest.Start(t, redfishtest.Options{})
	dir := t.TempDir()
	creds := bmc.WriteCredentials(t, dir)
	file := filepath.Join(dir, "inventory.yaml")
	writeFiles(t, dir, map[string]string{"inventory.yaml": `
- id: a
  ssh: {address: 10.0.0.1, user: root}
  redfish:
    endpoint: ` + bmc.URL + `
    allow_http: true
    credentials_file: ` + filepath.Base(creds) + `
    reset_type: GracefulRestart
`})
	p, err := New(ctx, testConfig(t, file), db.Public(), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Reboot(ctx, provided(t, db)["a"]); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	if r := bmc.Resets(); len(r) != 1 || r[0].ResetType != "GracefulRestart" {
		t.Fatalf("resets = %+v", r)
	}
}

// value reads a gauge or counter.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}
