package bmdb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// Simulated faults (migration 0032): 'shepherd sim fault' writes them and
// the simulated provider of every replica (providers/sim) reads them about
// once a second, so that a fault injected from outside the daemons reaches
// every replica's simulator. The BMDB only stores them: what a kind, a
// target and a state mean is the simulator's (docs/simulator.md).

// SimFault is one fault of the simulated fleet.
type SimFault struct {
	// Kind is what fails: "network" (a rack's switch), "power" (a PDU),
	// "site", "machine"; later kinds need no migration.
	Kind string
	// Target is the failing rack, PDU or machine (its provider id); ""
	// for the site.
	Target string
	// State is what the fault forces: "down", "off", "hang", "blip".
	State string
	// Params are a kind's parameters (none for the kinds above).
	Params map[string]any
	// Until is when the fault ends by itself (a blip); zero: when a
	// command ends it (or, for a hang, a power action reaches the machine).
	Until time.Time
	// Left is how long the fault lasts still, as the database's clock
	// sees it; zero without an end.
	Left time.Duration
	// Since is when it was injected.
	Since  time.Time
	Reason string
	Actor  Actor
}

// simFaultWordRE is what a kind and a state may be (the table's checks).
var simFaultWordRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// maxSimFaultTarget and maxSimFaultReason bound a fault's text (the
// table's checks).
const (
	maxSimFaultTarget = 200
	maxSimFaultReason = 1000
)

func scanSimFault(row pgx.CollectableRow) (SimFault, error) {
	var f SimFault
	var params []byte
	var until *time.Time
	var left *float64
	err := row.Scan(&f.Kind, &f.Target, &f.State, &params, &until, &left, &f.Since, &f.Reason, &f.Actor.Name, &f.Actor.Role)
	if err != nil {
		return f, err
	}
	if until != nil {
		f.Until = *until
	}
	if left != nil && *left > 0 {
		f.Left = time.Duration(*left * float64(time.Second))
	}
	if len(params) > 0 {
		if err := json.Unmarshal(params, &f.Params); err != nil {
			return f, fmt.Errorf("fault %s %s: parameters: %w", f.Kind, f.Target, err)
		}
	}
	return f, nil
}

// SimFaults returns the active faults (those without an end or whose end
// is ahead), by kind and target.
func (t *Tx) SimFaults(ctx context.Context) ([]SimFault, error) {
	fs, err := queryRows(ctx, t.tx, scanSimFault, qSimFaults)
	if err != nil {
		return nil, fmt.Errorf("reading the simulated faults: %w", err)
	}
	return fs, nil
}

// SetSimFault injects f (Kind, Target, State, Params, Reason), replacing
// the fault of the same kind and target, ending by itself after d (0:
// until ended), on actor's word. It returns the fault as stored.
func (t *Tx) SetSimFault(ctx context.Context, f SimFault, d time.Duration, actor Actor) (SimFault, error) {
	switch {
	case !simFaultWordRE.MatchString(f.Kind):
		return SimFault{}, fmt.Errorf("simulated fault kind %q: want a lower-case word", f.Kind)
	case !simFaultWordRE.MatchString(f.State):
		return SimFault{}, fmt.Errorf("simulated fault state %q: want a lower-case word", f.State)
	case len(f.Target) > maxSimFaultTarget:
		return SimFault{}, fmt.Errorf("simulated fault target: longer than %d bytes", maxSimFaultTarget)
	case len(f.Reason) > maxSimFaultReason:
		return SimFault{}, fmt.Errorf("simulated fault reason: longer than %d bytes", maxSimFaultReason)
	case d < 0:
		return SimFault{}, fmt.Errorf("simulated fault duration %s: negative", d)
	case actor.Name == "":
		return SimFault{}, errors.New("injecting a simulated fault: no actor")
	}
	params := f.Params
	if params == nil {
		params = map[string]any{}
	}
	p, err := json.Marshal(params)
	if err != nil {
		return SimFault{}, fmt.Errorf("simulated fault parameters: %w", err)
	}
	var secs *float64
	if d > 0 {
		s := d.Seconds()
		secs = &s
	}
	if _, err := t.tx.Exec(ctx, qEndEndedSimFaults, f.Kind, f.Target); err != nil {
		return SimFault{}, fmt.Errorf("deleting the simulated faults that ended: %w", err)
	}
	set, err := queryOne(ctx, t.tx, scanSimFault, qSetSimFault, f.Kind, f.Target, f.State, p, secs, f.Reason, actor.Name)
	if err != nil {
		return SimFault{}, fmt.Errorf("injecting the simulated fault %s %s: %w", f.Kind, f.Target, err)
	}
	return set, nil
}

// EndSimFault ends the fault of kind on target, returning it and whether
// there was one. With state given, it ends the fault only if it forces
// that state (the simulator ending a hang when a power action reaches the
// machine, not a blip injected since).
func (t *Tx) EndSimFault(ctx context.Context, kind, target, state string) (SimFault, bool, error) {
	var ended []SimFault
	var err error
	if state == "" {
		ended, err = queryRows(ctx, t.tx, scanSimFault, qEndSimFault, kind, target)
	} else {
		ended, err = queryRows(ctx, t.tx, scanSimFault, qEndSimFaultState, kind, target, state)
	}
	if err != nil {
		return SimFault{}, false, fmt.Errorf("ending the simulated fault %s %s: %w", kind, target, err)
	}
	if len(ended) == 0 {
		return SimFault{}, false, nil
	}
	return ended[0], true, nil
}

// EndSimFaults ends every fault, returning those that were active.
func (t *Tx) EndSimFaults(ctx context.Context) ([]SimFault, error) {
	ended, err := queryRows(ctx, t.tx, scanSimFault, qEndSimFaults)
	if err != nil {
		return nil, fmt.Errorf("ending the simulated faults: %w", err)
	}
	var active []SimFault
	for _, f := range ended {
		if f.Until.IsZero() || f.Left > 0 {
			active = append(active, f)
		}
	}
	return active, nil
}
