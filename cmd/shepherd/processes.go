package main

import (
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/processes"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// processDef is a process the daemon can run. Its flags and metrics need
// its Info before anything else exists, while the process itself needs the
// provider, which needs the database: so the daemon keeps the static Info
// and builds the process only once the provider is up.
type processDef struct {
	info  controlloop.Info
	build func(p processes.Provider) controlloop.Process
}

// catalogue lists every process the binary can run, in the order -processes
// lists them by default. Adding a process to shepherd means adding it here;
// rc is read when the process is built, after flags are parsed.
func catalogue(rc *recovery.Config) []processDef {
	return []processDef{
		{
			info:  agentstart.New(nil).Info(),
			build: func(p processes.Provider) controlloop.Process { return agentstart.New(p) },
		},
		{
			info:  recovery.New(nil, *rc).Info(),
			build: func(p processes.Provider) controlloop.Process { return recovery.New(p, *rc) },
		},
	}
}
