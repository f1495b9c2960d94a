package sim_test

import (
	"context"
	"flag"
	"testing"

	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// The simulated provider's definition is what a binary registers: its
// flags configure the provider New builds, and Prepare seeds the fleet.
func TestDefinition(t *testing.T) {
	def := sim.Definition()
	if def.Name != sim.Name || !def.Demo || def.New == nil {
		t.Fatalf("definition %+v: want name %s, demo, New", def, sim.Name)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	def.Flags(fs)
	if err := fs.Parse([]string{"-sim_machines=3"}); err != nil {
		t.Fatal(err)
	}
	if err := def.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	db := openDB(t)
	p, err := def.New(providers.Env{DB: db.Public()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	prep, ok := p.(providers.Preparer)
	if !ok {
		t.Fatalf("%T does not implement providers.Preparer", p)
	}
	if err := prep.Prepare(context.Background()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if n := len(simMachines(t, db)); n != 3 {
		t.Errorf("%d machines after Prepare with -sim_machines=3, want 3", n)
	}
	bad := sim.Definition()
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	bad.Flags(fs)
	if err := fs.Parse([]string{"-sim_machines=-1"}); err != nil {
		t.Fatal(err)
	}
	if err := bad.Check(); err == nil {
		t.Error("Check of -sim_machines=-1: no error")
	}
}
