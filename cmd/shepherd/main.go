// Command shepherd runs Shepherd's control loops over a fleet of bare-metal
// machines, coordinated through PostgreSQL (the BMDB). It is package daemon
// with the two shipped processes registered: a binary with processes of
// its own is built the same way (see package daemon).
package main

import (
	"os"

	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/processes/shipped"
)

func main() {
	d := daemon.New()
	d.AddProcess(shipped.AgentStart())
	d.AddProcess(shipped.Recovery())
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
