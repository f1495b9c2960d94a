package static

import (
	"context"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
	"github.com/shepherd-fleet/shepherd/providers"
)

// The static provider's definition is what a binary registers: -inventory
// is required, the provider New builds sends its agents to the daemon's
// heartbeat URL unless -agent_heartbeat_url names another, and Prepare
// syncs the inventory.
func TestDefinition(t *testing.T) {
	def := Definition()
	if def.Name != Name || def.Demo || def.New == nil {
		t.Fatalf("definition %+v: want name %s, no demo, New", def, Name)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	def.Flags(fs)
	if err := def.Check(); err == nil || !strings.Contains(err.Error(), "-inventory: required") {
		t.Errorf("Check without -inventory: %v, want it required", err)
	}

	dir := t.TempDir()
	sshdtest.WriteNewKey(t, filepath.Join(dir, "id_ed25519"))
	writeFiles(t, dir, map[string]string{"inventory.yaml": syncFirst, "shepherd-agent": "#!/bin/sh\n"})
	args := []string{
		"-inventory=" + filepath.Join(dir, "inventory.yaml"),
		"-ssh_key_file=" + filepath.Join(dir, "id_ed25519"),
		"-agent_binary=" + filepath.Join(dir, "shepherd-agent"),
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := def.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	db := openDB(t)
	p, err := def.New(providers.Env{DB: db.Public(), HeartbeatURL: "http://shepherd.example:7443/heartbeat"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	sp := p.(*Provider)
	if got := sp.cfg.SSH.HeartbeatURL; got != "http://shepherd.example:7443/heartbeat" {
		t.Errorf("heartbeat URL %q, want the daemon's", got)
	}
	if _, err := def.New(providers.Env{DB: db.Public()}); err == nil || !strings.Contains(err.Error(), "-agent_heartbeat_url: required") {
		t.Errorf("New without a heartbeat URL: %v, want -agent_heartbeat_url required", err)
	}
	if err := p.(providers.Preparer).Prepare(context.Background()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if got := len(provided(t, db)); got != len(sp.Inventory().Machines) || got == 0 {
		t.Errorf("%d machines after Prepare, want the inventory's %d", got, len(sp.Inventory().Machines))
	}
}
