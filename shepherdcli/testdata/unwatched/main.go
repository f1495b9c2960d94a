// Command unwatched is shepherd with one more process, BiosOutdated, whose
// condition reads a table (bios_outdated) that no due trigger watches: the
// runner refuses to run it, and the binary must exit with that error.
// TestUnwatchedTableExits builds and runs it.
package main

import (
	"context"
	"os"
	"time"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/shepherdcli"
)

func main() {
	d := shepherdcli.New()
	d.AddProcess(agentstart.Definition())
	d.AddProcess(recovery.Definition())
	d.AddProcess(controlloop.Definition{
		Info: controlloop.Info{
			Process:        bmdb.Process{Name: "BiosOutdated"},
			Label:          "biosoutdated",
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2},
		},
		// Machines listed in bios_outdated, which no trigger watches.
		Candidates: func() (bmdb.Candidates, error) {
			return bmdb.NewCandidates(bmdb.Condition{
				Name: "bios_outdated",
				SQL:  `EXISTS (SELECT 1 FROM bios_outdated b WHERE b.machine_id = m.machine_id)`,
			})
		},
		New: func(controlloop.Env) (controlloop.Handler, error) {
			return controlloop.HandlerFunc(func(context.Context, *controlloop.Task) error { return nil }), nil
		},
	})
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
