// Command fleetd is Shepherd with a process of its own: AgentStart and
// Recovery, shipped with Shepherd, and FirmwareCheck, this module's. Run it
// like shepherd (fleetd -h); -provider simfirmware is a simulated fleet
// whose machines have firmware.
package main

import (
	"os"

	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/shepherdcli"

	"example.com/firmwarecheck/firmwarecheck"
	"example.com/firmwarecheck/simfirmware"
)

func main() {
	d := shepherdcli.New()
	d.AddProcess(agentstart.Definition())
	d.AddProcess(recovery.Definition())
	d.AddProcess(firmwarecheck.Definition())
	d.AddProvider(simfirmware.Definition())
	os.Exit(d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
