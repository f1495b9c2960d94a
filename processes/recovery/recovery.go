// Package recovery is the ShepherdRecovery process: it reboots machines
// whose agent never came up or stopped heartbeating, and hands them back to
// AgentStart by deleting their agent tags.
package recovery

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
)

// Process is Recovery's identity in the BMDB; it excludes AgentStart
// through the shared "Shepherd" group. Treat it as a constant.
var Process = bmdb.Process{Name: "ShepherdRecovery", ExclusionGroup: "Shepherd"}

// Label names the process in flags (-recovery_...) and metrics.
const Label = "recovery"

// Default timeouts.
const (
	DefaultStartTimeout     = 30 * time.Minute
	DefaultHeartbeatTimeout = 10 * time.Minute
	// DefaultVerifyTimeout is how long a reset machine has to come back
	// (its agent heartbeating with a new boot identity). Servers take 3
	// to 10 minutes to POST and boot (memory training, RAID and NIC
	// option ROMs); AgentStart then needs an SSH connection and a few
	// seconds, or, after a failed first try, its backoff (5 min at
	// first). 20 minutes covers a slow POST plus one AgentStart retry,
	// and still acts again well within the hour on a machine that hangs.
	DefaultVerifyTimeout = 20 * time.Minute
)

// Config says when an agent counts as dead.
type Config struct {
	// StartTimeout is how long a started agent may take to send its first
	// heartbeat.
	StartTimeout time.Duration
	// HeartbeatTimeout is how old the last heartbeat of a running agent may
	// get.
	HeartbeatTimeout time.Duration
	// VerifyTimeout is how long a reset machine may take to come back
	// before Recovery records NotRecovered and acts on it again.
	VerifyTimeout time.Duration
}

// DefaultConfig returns the default timeouts.
func DefaultConfig() Config {
	return Config{StartTimeout: DefaultStartTimeout, HeartbeatTimeout: DefaultHeartbeatTimeout, VerifyTimeout: DefaultVerifyTimeout}
}

// RegisterFlags registers -recovery_start_timeout and
// -recovery_heartbeat_timeout on fs, with c's values as defaults (the
// package defaults for zero fields).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.VerifyTimeout == 0 {
		c.VerifyTimeout = DefaultVerifyTimeout
	}
	fs.DurationVar(&c.StartTimeout, Label+"_start_timeout", c.StartTimeout,
		"reboot a machine whose agent was started this long ago and never heartbeated")
	fs.DurationVar(&c.HeartbeatTimeout, Label+"_heartbeat_timeout", c.HeartbeatTimeout,
		"reboot a machine whose agent's last heartbeat is this old")
	fs.DurationVar(&c.VerifyTimeout, Label+"_verify_timeout", c.VerifyTimeout,
		"act again on a reset machine whose agent has not heartbeated with a new boot identity after this long (servers take 3-10 min to POST and boot)")
}

// Check validates the configuration; its errors name the flag.
func (c *Config) Check() error {
	if c.StartTimeout <= 0 {
		return fmt.Errorf("-%s_start_timeout %s: must be positive", Label, c.StartTimeout)
	}
	if c.HeartbeatTimeout <= 0 {
		return fmt.Errorf("-%s_heartbeat_timeout %s: must be positive", Label, c.HeartbeatTimeout)
	}
	if c.VerifyTimeout <= 0 {
		return fmt.Errorf("-%s_verify_timeout %s: must be positive", Label, c.VerifyTimeout)
	}
	return nil
}

// Definition defines Recovery for a binary to register. Its timeouts are
// flags (-recovery_start_timeout, -recovery_heartbeat_timeout,
// -recovery_verify_timeout), which its condition reads once they are
// parsed, and which demo mode shortens so that a demo shows reboots within
// minutes. The default backoff retries sooner than AgentStart's: a machine
// in Recovery is already known to be broken, and a reboot is cheap.
func Definition() controlloop.Definition {
	cfg := DefaultConfig()
	return controlloop.Definition{
		Info: controlloop.Info{
			Process:        Process,
			Label:          Label,
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 1.2},
			// A machine rebooted three times in a day without staying healthy
			// needs a human (docs/real-fleet.md, "A machine escalated").
			DefaultMachineBudget: DefaultMachineBudget,
			// A power read and one action, each bounded by -ipmi_timeout or
			// -redfish_timeout (30 s at most by default): 5 minutes is a hang.
			DefaultRunTimeout: 5 * time.Minute,
		},
		Candidates: func() (bmdb.Candidates, error) { return cfg.Candidates(), nil },
		Explain:    cfg.Explain,
		Flags:      cfg.RegisterFlags,
		Check:      cfg.Check,
		New: func(env controlloop.Env) (controlloop.Handler, error) {
			if env.Provider == nil {
				return nil, errors.New("Recovery needs a provider")
			}
			return New(env.Provider, cfg), nil
		},
		DemoFlags: map[string]string{
			Label + "_heartbeat_timeout": "30s",
			Label + "_start_timeout":     "1m",
		},
	}
}

// Explain returns the facts Recovery's condition under c reads on
// machine: when its agent started and last heartbeated, the timeouts they
// are judged by, and a pending reset (the controlloop.Definition's
// Explain).
func (c *Config) Explain(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]bmdb.Fact, error) {
	f, err := tx.AgentFacts(ctx, machine)
	if err != nil {
		return nil, err
	}
	var facts []bmdb.Fact
	switch {
	case f.AgentStartedAt == nil:
		facts = append(facts, bmdb.Fact{Name: "agent", Value: "none started"})
	case f.LastHeartbeat == nil:
		facts = append(facts,
			bmdb.Fact{Name: "agent started", Value: f.Ago(*f.AgentStartedAt)},
			bmdb.Fact{Name: "last heartbeat", Value: "never"},
			bmdb.Fact{Name: "start timeout", Value: c.StartTimeout.String()})
	default:
		facts = append(facts,
			bmdb.Fact{Name: "agent started", Value: f.Ago(*f.AgentStartedAt)},
			bmdb.Fact{Name: "last heartbeat", Value: f.Ago(*f.LastHeartbeat)},
			bmdb.Fact{Name: "heartbeat timeout", Value: c.HeartbeatTimeout.String()})
	}
	if r := f.Reset; r != nil {
		facts = append(facts, bmdb.Fact{Name: "reset", Value: fmt.Sprintf("%s, awaiting a heartbeat of a new boot until %s",
			r.ResetAt.UTC().Format(time.RFC3339), r.VerifyBy.UTC().Format(time.RFC3339))})
	}
	return facts, nil
}

// Candidates are the machines that need Recovery under c: machines whose
// agent never heartbeated within StartTimeout or whose heartbeat is older
// than HeartbeatTimeout, and machines a reset did not bring back within
// VerifyTimeout (see verify.go).
func (c *Config) Candidates() bmdb.Candidates {
	return Candidates(c.StartTimeout, c.HeartbeatTimeout)
}

// Recovery is Recovery's code (a controlloop.Handler).
type Recovery struct {
	provider providers.Provider
	cfg      Config
}

// New returns the Recovery process acting through p; cfg must have passed
// Check, except that a zero VerifyTimeout (a Config written before it
// existed) means DefaultVerifyTimeout.
func New(p providers.Provider, cfg Config) *Recovery {
	if cfg.VerifyTimeout == 0 {
		cfg.VerifyTimeout = DefaultVerifyTimeout
	}
	return &Recovery{provider: p, cfg: cfg}
}

// Run implements controlloop.Handler: it reads the machine's power and
// powers it on or resets it (powerAct), records what it read and did, and,
// when the work finishes, deletes its agent tags, which makes
// it an AgentStart candidate again. A provider error carrying a
// backoff.Error sets the task's backoff.
func (r *Recovery) Run(ctx context.Context, t *controlloop.Task) error {
	m, err := t.Provided(ctx)
	if err != nil {
		return err
	}
	if err := noteNotRecovered(ctx, t); err != nil {
		return err
	}
	seen, err := r.powerAct(ctx, m)
	r.recordPower(ctx, t, seen)
	if err != nil {
		return err
	}
	t.Note = seen.Done
	t.Commit = r.commitReset(t.Machine)
	return nil
}
