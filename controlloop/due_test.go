package controlloop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// A process whose condition reads a table that no due trigger watches would
// never be woken by writes to it: the runner refuses to run it, at once,
// with the statement that fixes it.
func TestRunnerRefusesUnwatchedTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	err := e.db.Transact(t.Context(), func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE bios_outdated (machine_id uuid PRIMARY KEY REFERENCES machines (machine_id))`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cand, err := bmdb.NewCandidates(bmdb.Condition{
		Name: "bios_outdated",
		SQL:  `EXISTS (SELECT 1 FROM bios_outdated b WHERE b.machine_id = m.machine_id)`,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := newProcess(func(context.Context, *controlloop.Task) error { return nil })
	p.candidates = cand
	r, err := controlloop.NewRunner(e.db.Public(), p.definition(), p, fastConfig(p, 1), controlloop.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, bmdb.ErrUnwatchedTable) || ctx.Err() != nil {
		t.Fatalf("Run: %v; want ErrUnwatchedTable before the deadline", err)
	}
	t.Logf("refused: %v", err)
}
