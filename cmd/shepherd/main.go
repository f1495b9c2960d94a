// Command shepherd runs Shepherd's control loops over a fleet of bare-metal
// machines, coordinated through PostgreSQL (the BMDB). See package daemon
// and README.md.
package main

import (
	"os"

	"github.com/shepherd-fleet/shepherd/daemon"
)

func main() {
	os.Exit(daemon.Main(os.Args[1:], os.Stdout, os.Stderr))
}
