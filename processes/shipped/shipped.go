// Package shipped registers the processes shipped with Shepherd, AgentStart
// and Recovery, with a binary built on package shepherdcli:
//
//	c := shepherdcli.New()
//	c.AddProcess(shipped.AgentStart())
//	c.AddProcess(shipped.Recovery())
//
// It only adapts agentstart.Definition() and recovery.Definition() to the
// daemon's definition type, which is about to become theirs
// (controlloop.Definition); it goes then.
package shipped

import (
	"context"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// AgentStart registers agentstart.Definition(): it starts the agent on
// provided machines that have none.
func AgentStart() daemon.Process { return Adapt(agentstart.Definition()) }

// Recovery registers recovery.Definition(): it reboots machines whose
// agent died.
func Recovery() daemon.Process { return Adapt(recovery.Definition()) }

// Adapt makes a controlloop.Definition a daemon.Process.
func Adapt(def controlloop.Definition) daemon.Process {
	p := daemon.Process{
		Info:       def.Info,
		Flags:      def.Flags,
		Check:      def.Check,
		Disabled:   def.Disabled,
		Migrations: def.Migrations,
		DemoFlags:  def.DemoFlags,
		New: func(env daemon.Env) (controlloop.Process, error) {
			if env.Provider == nil {
				// The operator CLI reads the condition only.
				return bound{def: def}, nil
			}
			h, err := def.New(controlloop.Env{Provider: env.Provider, DB: env.DB})
			if err != nil {
				return nil, err
			}
			return bound{def: def, h: h}, nil
		},
	}
	if def.Tags != nil {
		p.Tags = func(ctx context.Context, tx *bmdb.Tx, machine uuid.UUID) ([]daemon.Tag, error) {
			tags, err := def.Tags(ctx, tx, machine)
			out := make([]daemon.Tag, len(tags))
			for i, t := range tags {
				out[i] = daemon.Tag{Name: t.Name, Value: t.Value}
			}
			return out, err
		}
	}
	return p
}

// bound is a definition with its handler, as the daemon still takes them.
type bound struct {
	def controlloop.Definition
	h   controlloop.Handler
}

func (b bound) Info() controlloop.Info      { return b.def.Info }
func (b bound) Candidates() bmdb.Candidates { return b.def.Candidates() }
func (b bound) Run(ctx context.Context, t *controlloop.Task) error {
	return b.h.Run(ctx, t)
}
