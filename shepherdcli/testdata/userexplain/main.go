// Command userexplain is shepherd with two processes of a user's beside
// the shipped ones: RackAudit, whose definition explains its condition
// (the machine's location, against the one it wants), and Quiet, whose
// definition does not. TestExplainUserProcess builds it and runs its
// explain.
package main

import (
	"context"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/shepherdcli"
)

// auditPrefix is the location RackAudit acts under.
const auditPrefix = "audit/"

func main() {
	d := shepherdcli.New()
	d.AddProcess(agentstart.Definition())
	d.AddProcess(recovery.Definition())
	rackAudit := userProcess("RackAudit", "rackaudit", bmdb.Condition{
		Name: "rack_audit",
		SQL:  `EXISTS (SELECT 1 FROM machine_provided p WHERE p.machine_id = m.machine_id AND starts_with(p.location, @prefix))`,
		Args: map[string]any{"prefix": auditPrefix},
	})
	rackAudit.Explain = func(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]bmdb.Fact, error) {
		p, err := tx.Provided(ctx, machine)
		if err != nil {
			return nil, err
		}
		return []bmdb.Fact{{Name: "location", Value: p.Location}, {Name: "audited under", Value: auditPrefix}}, nil
	}
	d.AddProcess(rackAudit)
	d.AddProcess(userProcess("Quiet", "quiet", bmdb.Condition{Name: "never", SQL: `m.machine_id IS NULL`}))
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}

// userProcess is a process of cond that does nothing.
func userProcess(name, label string, cond bmdb.Condition) controlloop.Definition {
	return controlloop.Definition{
		Info: controlloop.Info{
			Process:        bmdb.Process{Name: name},
			Label:          label,
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2},
		},
		Candidates: func() (bmdb.Candidates, error) { return bmdb.NewCandidates(cond) },
		New: func(controlloop.Env) (controlloop.Handler, error) {
			return controlloop.HandlerFunc(func(context.Context, *controlloop.Task) error { return nil }), nil
		},
	}
}
