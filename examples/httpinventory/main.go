// Command inventoryd is Shepherd with a provider of its own: AgentStart and
// Recovery, shipped with Shepherd, run on the machines an HTTP inventory
// lists (-httpinventory_url), which the provider adds and removes as the
// inventory changes, with Shepherd's simulated agents on them. Run it like
// shepherd (inventoryd -h).
package main

import (
	"os"

	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/shepherdcli"

	"example.com/httpinventory/httpinv"
)

func main() {
	d := shepherdcli.New()
	d.DefaultProvider = httpinv.Name
	d.AddProcess(agentstart.Definition())
	d.AddProcess(recovery.Definition())
	d.AddProvider(httpinv.Definition())
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
