// Command shepherd runs Shepherd's control loops over a fleet of bare-metal
// machines, coordinated through PostgreSQL (the BMDB). It is Shepherd's
// command line (package shepherdcli) with the two shipped processes
// registered: a binary with processes of its own is built the same way.
package main

import (
	"os"

	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/shepherdcli"
)

func main() {
	d := shepherdcli.New()
	d.AddProcess(agentstart.Definition())
	d.AddProcess(recovery.Definition())
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
