// Command unwatched is shepherd with one more process, BiosOutdated, whose
// condition reads a table (bios_outdated) that no due trigger watches: the
// runner refuses to run it, and the binary must exit with that error.
// TestUnwatchedTableExits builds and runs it.
package main

import (
	"context"
	"os"
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/processes/shipped"
	"github.com/shepherd-fleet/shepherd/shepherdcli"
)

type biosOutdated struct{ candidates bmdb.Candidates }

func (biosOutdated) Info() controlloop.Info {
	return controlloop.Info{
		Process:        bmdb.Process{Name: "BiosOutdated"},
		Label:          "biosoutdated",
		DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 2},
	}
}

func (b biosOutdated) Candidates() bmdb.Candidates { return b.candidates }

func (biosOutdated) Run(context.Context, *controlloop.Task) error { return nil }

func main() {
	d := shepherdcli.New()
	d.AddProcess(shipped.AgentStart())
	d.AddProcess(shipped.Recovery())
	d.AddProcess(daemon.Process{
		Info: biosOutdated{}.Info(),
		New: func(daemon.Env) (controlloop.Process, error) {
			cand, err := bmdb.NewCandidates(bmdb.Condition{
				Name: "bios_outdated",
				SQL:  `EXISTS (SELECT 1 FROM bios_outdated b WHERE b.machine_id = m.machine_id)`,
			})
			return biosOutdated{cand}, err
		},
	})
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
