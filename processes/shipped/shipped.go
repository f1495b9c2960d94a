// Package shipped defines the processes shipped with Shepherd, AgentStart
// and Recovery, for a binary built on package daemon:
//
//	d := daemon.New()
//	d.AddProcess(shipped.AgentStart())
//	d.AddProcess(shipped.Recovery())
//
// The definitions live apart from the processes so that the processes do
// not depend on the daemon (whose tests run them).
package shipped

import (
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// AgentStart defines agentstart.AgentStart: it starts the agent on
// provided machines that have none.
func AgentStart() daemon.Process {
	return daemon.Process{
		Info: agentstart.New(nil).Info(),
		New: func(env daemon.Env) (controlloop.Process, error) {
			return agentstart.New(env.Provider), nil
		},
	}
}

// Recovery defines recovery.Recovery: it reboots machines whose agent
// died. Its timeouts are flags (-recovery_start_timeout,
// -recovery_heartbeat_timeout), which demo mode shortens so that a demo
// shows reboots within minutes.
func Recovery() daemon.Process {
	cfg := recovery.DefaultConfig()
	return daemon.Process{
		Info:  recovery.New(nil, cfg).Info(),
		Flags: cfg.RegisterFlags,
		Check: cfg.Check,
		New: func(env daemon.Env) (controlloop.Process, error) {
			return recovery.New(env.Provider, cfg), nil
		},
		DemoFlags: map[string]string{
			recovery.Label + "_heartbeat_timeout": "30s",
			recovery.Label + "_start_timeout":     "1m",
		},
	}
}
