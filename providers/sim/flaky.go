package sim

import (
	"errors"
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/metric"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// Flaky BMCs (issue 53, item 7; docs/simulator.md): 'shepherd sim fault
// bmc MACHINE|RACK flaky -drop P -wrong P -sessions N -freeze_after N'
// makes the simulated BMC of a machine (or of every machine of a rack)
// behave as the BMCs that hurt operators do: requests lost, a wrong power
// state, a session limit, a freeze after a burst of commands. The fault's
// parameters travel in sim_fault.params.

const (
	// FaultBMC: a machine's (target: its provider id) or a rack's
	// (target: its name) BMCs are flaky (state FaultFlaky), as its
	// parameters (FlakyBMC) say, until the fault is cleared.
	FaultBMC   = "bmc"
	FaultFlaky = "flaky"
)

// The names of a flaky fault's parameters in sim_fault.params, as the
// command line's flags name them.
const (
	ParamDrop        = "drop"
	ParamWrong       = "wrong"
	ParamSessions    = "sessions"
	ParamFreezeAfter = "freeze_after"
)

// The kinds of answer a flaky BMC spoils (shepherd_sim_bmc_faults_total).
const (
	bmcDropped = "dropped"
	bmcWrong   = "wrong"
	bmcBusy    = "busy"
	bmcFrozen  = "frozen"
)

// FlakyBMC is how a flaky BMC misbehaves. Its zero value is a BMC that
// behaves.
type FlakyBMC struct {
	// Drop is the probability that a power read or action is lost: it
	// fails as unreachable.
	Drop float64
	// Wrong is the probability that a power read answers the opposite
	// of the machine's power.
	Wrong float64
	// Sessions, when above 0, is the most conversations the BMC holds at
	// once; one more fails as busy.
	Sessions int
	// FreezeAfter, when above 0, is the number of commands after which
	// the BMC answers nothing (unreachable) until the fault is cleared.
	FreezeAfter int
}

// Check validates f; its errors name the parameter as the command line
// does.
func (f FlakyBMC) Check() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{ParamDrop, f.Drop}, {ParamWrong, f.Wrong}} {
		if math.IsNaN(p.v) || p.v < 0 || p.v > 1 {
			return fmt.Errorf("-%s %v: want a probability from 0 to 1", p.name, p.v)
		}
	}
	if f.Sessions < 0 {
		return fmt.Errorf("-%s %d: must not be negative (0: no limit)", ParamSessions, f.Sessions)
	}
	if f.FreezeAfter < 0 {
		return fmt.Errorf("-%s %d: must not be negative (0: never)", ParamFreezeAfter, f.FreezeAfter)
	}
	return nil
}

// Params returns f as sim_fault.params stores it.
func (f FlakyBMC) Params() map[string]any {
	return map[string]any{ParamDrop: f.Drop, ParamWrong: f.Wrong, ParamSessions: f.Sessions, ParamFreezeAfter: f.FreezeAfter}
}

// flakyFromParams reads a flaky fault's parameters, as decoded from JSON;
// ok is false for parameters this binary cannot use (the fault is then
// left out, as a kind it does not know would be).
func flakyFromParams(p map[string]any) (FlakyBMC, bool) {
	num := func(name string) (float64, bool) {
		v, found := p[name]
		if !found {
			return 0, true
		}
		x, ok := v.(float64)
		return x, ok
	}
	drop, ok1 := num(ParamDrop)
	wrong, ok2 := num(ParamWrong)
	sessions, ok3 := num(ParamSessions)
	freeze, ok4 := num(ParamFreezeAfter)
	if !ok1 || !ok2 || !ok3 || !ok4 || sessions > math.MaxInt32 || freeze > math.MaxInt32 {
		return FlakyBMC{}, false
	}
	f := FlakyBMC{Drop: drop, Wrong: wrong, Sessions: int(sessions), FreezeAfter: int(freeze)}
	return f, f.Check() == nil
}

// flakyFor returns how the BMC of the machine providerID misbehaves: its
// own fault, else its rack's.
func (f faults) flakyFor(providerID string) (FlakyBMC, bool) {
	if fl, ok := f.flaky[providerID]; ok {
		return fl, true
	}
	d, ok := simDomains(providerID)
	if !ok {
		return FlakyBMC{}, false
	}
	fl, ok := f.flakyRacks[d.rack]
	return fl, ok
}

// bmcState is what a simulated BMC remembers across conversations.
type bmcState struct {
	// open counts the conversations in progress.
	open int
	// flaky is the fault commands counts the commands under: a new or
	// changed fault starts the count again.
	flaky    FlakyBMC
	commands int
}

// bmcMetrics are the simulated BMCs' own metrics, besides the power
// actions.
type bmcMetrics struct {
	faults *prometheus.CounterVec
	// maxConversations is the most conversations any one simulated BMC
	// had at once, refused ones included: a test checks with it that the
	// per-BMC limit of the replicas was never exceeded.
	maxConversations prometheus.Gauge
	max              int
}

func newBMCMetrics() *bmcMetrics {
	c := metric.CounterVec(nil, "shepherd_sim_bmc_faults_total",
		"Answers the flaky simulated BMCs spoiled, by kind: dropped (unreachable), wrong (the opposite power state), busy (beyond the session limit), frozen (after the command limit).", "kind")
	for _, k := range []string{bmcDropped, bmcWrong, bmcBusy, bmcFrozen} {
		c.WithLabelValues(k)
	}
	g := metric.Gauge(nil, "shepherd_sim_bmc_max_conversations",
		"The most conversations (power reads and actions) one simulated BMC had at once since the start, those it refused as busy included.")
	return &bmcMetrics{faults: c, maxConversations: g}
}

func (m *bmcMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.faults, m.maxConversations} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("sim: registering the simulated BMCs' metrics: %w", err)
		}
	}
	return nil
}

// MaxConversations returns the most conversations one simulated BMC had
// at once (shepherd_sim_bmc_max_conversations).
func (a *Agents) MaxConversations() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bmcMetrics.max
}

// converse opens a conversation (one power read or action) with the BMC
// of m and returns the function that closes it, to be called in every
// case. Its error, classified by bmcerr, says why the BMC did not take the
// command: a fault makes it unreachable, or it is flaky and froze, lost
// the request or has no session left. A frozen BMC's command still counts
// as received, so that the freeze lasts until the fault is cleared.
func (a *Agents) converse(m bmdb.Provided) (func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := m.ProviderID
	st := a.bmcs[id]
	if st == nil {
		st = &bmcState{}
		a.bmcs[id] = st
	}
	st.open++
	if st.open > a.bmcMetrics.max {
		a.bmcMetrics.max = st.open
		a.bmcMetrics.maxConversations.Set(float64(st.open))
	}
	end := func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		st.open--
	}
	if why := a.faults.unreachable(id); why != "" {
		return end, bmcerr.New(bmcerr.Unreachable, fmt.Errorf("sim: BMC of %s unreachable (simulated fault: %s): %w", id, why, errUnreachable))
	}
	fl, ok := a.faults.flakyFor(id)
	if !ok {
		return end, nil
	}
	if st.flaky != fl {
		st.flaky, st.commands = fl, 0
	}
	st.commands++
	switch {
	case fl.FreezeAfter > 0 && st.commands > fl.FreezeAfter:
		a.bmcMetrics.faults.WithLabelValues(bmcFrozen).Inc()
		return end, bmcerr.New(bmcerr.Unreachable, fmt.Errorf("sim: BMC of %s unreachable (simulated fault: frozen after %d commands): %w", id, fl.FreezeAfter, errUnreachable))
	case a.rng.Float64() < fl.Drop:
		a.bmcMetrics.faults.WithLabelValues(bmcDropped).Inc()
		return end, bmcerr.New(bmcerr.Unreachable, fmt.Errorf("sim: BMC of %s unreachable (simulated fault: request dropped): %w", id, errUnreachable))
	case fl.Sessions > 0 && st.open > fl.Sessions:
		a.bmcMetrics.faults.WithLabelValues(bmcBusy).Inc()
		return end, bmcerr.New(bmcerr.Busy, fmt.Errorf("sim: BMC of %s busy (simulated fault: %d conversations, limit %d): %w", id, st.open, fl.Sessions, errBusy))
	}
	return end, nil
}

// errBusy is wrapped by the errors of a flaky BMC beyond its session limit.
var errBusy = errors.New("maximum number of sessions reached")

// wrongPower reports whether the flaky BMC of the machine providerID
// answers this power read with the wrong state, and counts it; a.mu is
// held (the random source).
func (a *Agents) wrongPower(providerID string) bool {
	fl, ok := a.faults.flakyFor(providerID)
	if !ok || !(a.rng.Float64() < fl.Wrong) {
		return false
	}
	a.bmcMetrics.faults.WithLabelValues(bmcWrong).Inc()
	return true
}
