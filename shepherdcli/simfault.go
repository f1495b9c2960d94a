package shepherdcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/providers/sim"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// shepherd sim fault (issue 50, item 5; docs/simulator.md): faults of the
// simulated fleet, written to the BMDB (table sim_fault), which every
// replica's simulator reads about once a second. Each kind of fault is a
// row of simFaultKinds: what it targets, and which of its states inject
// or end it; a later kind (a flaky BMC, a bad agent build) is one more row.

// simFaultKind is one kind of fault the command injects.
type simFaultKind struct {
	// target names the kind's target in usage ("RACK"); "" for a kind
	// without one (the site).
	target string
	// resolve checks the target named on the command line against the
	// fleet and returns it as stored and the machines it covers, for
	// the output.
	resolve func(c *cli, ctx context.Context, arg string) (target, machines string, err error)
	// inject maps the states that inject the fault to the state stored;
	// end is the state that ends it.
	inject map[string]string
	end    string
	// timed is the injected state that takes a DURATION (a blip).
	timed string
	// params is the injected state that takes the flaky flags (-drop,
	// -wrong, -sessions, -freeze_after).
	params string
}

// simFaultKinds are the faults by kind, as the command line names them.
var simFaultKinds = map[string]simFaultKind{
	sim.FaultNetwork: {target: "RACK", resolve: (*cli).simRack, inject: map[string]string{"down": sim.FaultDown}, end: "up"},
	sim.FaultPower:   {target: "PDU", resolve: (*cli).simPDU, inject: map[string]string{"off": sim.FaultOff}, end: "on"},
	sim.FaultSite:    {inject: map[string]string{"down": sim.FaultDown}, end: "up"},
	sim.FaultMachine: {target: "MACHINE", resolve: (*cli).simMachine,
		inject: map[string]string{"hang": sim.FaultHang, "blip": sim.FaultBlip}, end: "clear", timed: "blip"},
	sim.FaultBMC: {target: "MACHINE|RACK", resolve: (*cli).simBMC,
		inject: map[string]string{"flaky": sim.FaultFlaky}, end: "clear", params: sim.FaultFlaky},
}

// flakyOptions are the flags of a flaky BMC.
type flakyOptions = sim.FlakyBMC

// maxBlip bounds a blip's DURATION: a longer silence is a hang.
const maxBlip = 24 * time.Hour

func simFlags(fs *flag.FlagSet, o *cliOptions) {
	fs.StringVar(&o.reason, "reason", "", "why (optional): recorded with the fault")
	fs.Float64Var(&o.flaky.Drop, sim.ParamDrop, 0, "bmc ... flaky: probability (0..1) that a power read or action is lost (unreachable)")
	fs.Float64Var(&o.flaky.Wrong, sim.ParamWrong, 0, "bmc ... flaky: probability (0..1) that a power read answers the wrong state")
	fs.IntVar(&o.flaky.Sessions, sim.ParamSessions, 0, "bmc ... flaky: at most this many conversations at once with the BMC, more answer busy (0: no limit)")
	fs.IntVar(&o.flaky.FreezeAfter, sim.ParamFreezeAfter, 0, "bmc ... flaky: after this many commands the BMC answers nothing until cleared (0: never)")
	asFlag(fs, o)
}

// simUsageError is a bad sim command line, with the usage appended.
func simUsageError(format string, args ...any) error {
	return usagef("%s (usage: shepherd sim fault KIND [TARGET] STATE [DURATION] [-drop P -wrong P -sessions N -freeze_after N]; docs/simulator.md)", fmt.Sprintf(format, args...))
}

// sim runs 'sim fault ...'.
func (c *cli) sim(ctx context.Context, args []string) error {
	if args[0] != "fault" {
		return simUsageError("sim %q: unknown subcommand, want fault", args[0])
	}
	args = args[1:]
	switch {
	case args[0] == "list" && len(args) == 1:
		return c.simFaultList(ctx)
	case args[0] == "clear" && len(args) == 1:
		if err := c.simFleet(ctx); err != nil {
			return err
		}
		return c.simFaultClear(ctx)
	case args[0] == "list" || args[0] == "clear":
		return simUsageError("sim fault %s: unexpected %q", args[0], args[1])
	}
	kind, ok := simFaultKinds[args[0]]
	if !ok {
		return simUsageError("KIND %q: want network, power, site, machine, bmc, clear or list", args[0])
	}
	name := args[0]
	args = args[1:]
	if kind.target != "" {
		if len(args) == 0 {
			return simUsageError("sim fault %s: give the %s", name, kind.target)
		}
	} else {
		args = append([]string{""}, args...)
	}
	if len(args) < 2 {
		return simUsageError("sim fault %s: give the STATE: %s", name, kind.states())
	}
	state, rest := args[1], args[2:]
	if state != kind.end && kind.inject[state] == "" {
		return simUsageError("sim fault %s: STATE %q: want %s", name, state, kind.states())
	}
	d, err := kind.duration(name, state, rest)
	if err != nil {
		return err
	}
	f := bmdb.SimFault{Kind: name, State: kind.inject[state]}
	if f.Params, err = kind.flakyParams(name, state, c.opts.flaky); err != nil {
		return err
	}
	if err := c.simFleet(ctx); err != nil {
		return err
	}
	target, machines := "", "every machine"
	if kind.resolve != nil {
		if target, machines, err = kind.resolve(c, ctx, args[0]); err != nil {
			return err
		}
	}
	if state == kind.end {
		return c.simFaultEnd(ctx, name, target)
	}
	f.Target = target
	return c.simFaultInject(ctx, f, d, machines)
}

// flakyParams checks the flaky flags: only for the state that takes them,
// at least one given, each in its range. It returns them as stored.
func (k simFaultKind) flakyParams(name, state string, fl sim.FlakyBMC) (map[string]any, error) {
	if state != k.params || k.params == "" {
		if fl != (sim.FlakyBMC{}) {
			return nil, simUsageError("sim fault %s %s: -drop, -wrong, -sessions and -freeze_after are for sim fault bmc MACHINE|RACK flaky", name, state)
		}
		return nil, nil
	}
	if err := fl.Check(); err != nil {
		return nil, simUsageError("sim fault %s %s: %v", name, state, err)
	}
	if fl == (sim.FlakyBMC{}) {
		return nil, simUsageError("sim fault %s %s: give at least one of -drop P, -wrong P, -sessions N, -freeze_after N", name, state)
	}
	return fl.Params(), nil
}

// states lists the kind's states for usage errors.
func (k simFaultKind) states() string {
	var s []string
	for _, st := range slices.Sorted(maps.Keys(k.inject)) {
		if st == k.timed {
			st += " DURATION"
		}
		s = append(s, st)
	}
	return strings.Join(append(s, k.end), ", ")
}

// duration checks the arguments after STATE: a DURATION for the timed
// state, nothing otherwise.
func (k simFaultKind) duration(name, state string, rest []string) (time.Duration, error) {
	if state != k.timed || k.timed == "" {
		if len(rest) > 0 {
			return 0, simUsageError("sim fault %s %s: unexpected %q", name, state, rest[0])
		}
		return 0, nil
	}
	if len(rest) != 1 {
		return 0, simUsageError("sim fault %s %s: give one DURATION (e.g. 60s)", name, state)
	}
	d, err := time.ParseDuration(rest[0])
	if err != nil || d <= 0 || d > maxBlip {
		return 0, simUsageError("sim fault %s %s: DURATION %q: want a duration above 0 and at most %s (e.g. 60s)", name, state, untrusted.Line(rest[0], 40), maxBlip)
	}
	return d, nil
}

// simFleet refuses a database without a simulated fleet: the faults would
// reach no machine (and a real fleet is not simulated).
func (c *cli) simFleet(ctx context.Context) error {
	ok, err := c.simExists(ctx, 0)
	if err != nil {
		return err
	}
	if !ok {
		return usagef("sim fault: this BMDB has no simulated machines (provider %q, %s onwards): faults are for a fleet run with -provider sim", sim.Name, sim.ProviderID(0))
	}
	return nil
}

// simExists reports whether the i-th simulated machine is in the BMDB.
func (c *cli) simExists(ctx context.Context, i int) (bool, error) {
	found, err := c.db.MachinesByProviderID(ctx, sim.ProviderID(i))
	if err != nil {
		return false, err
	}
	for _, m := range found {
		if m.Provider == sim.Name {
			return true, nil
		}
	}
	return false, nil
}

// simRange checks that the simulated machines first to last (the ones a
// rack or PDU holds in the largest fleet) include at least the first, and
// describes those the BMDB has: a fleet's machines are sim-0000 onwards,
// so the last is found by bisection.
func (c *cli) simRange(ctx context.Context, field, name string, first, last int) (string, error) {
	ok, err := c.simExists(ctx, first)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", usagef("sim fault: %s %q: the simulated fleet has no machine in it (no %s)", field, name, sim.ProviderID(first))
	}
	lo, hi := first, last // lo exists; find the last that does
	for lo < hi {
		mid := (lo + hi + 1) / 2
		ok, err := c.simExists(ctx, mid)
		if err != nil {
			return "", err
		}
		if ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return fmt.Sprintf("%d machines, %s to %s", lo-first+1, sim.ProviderID(first), sim.ProviderID(lo)), nil
}

func (c *cli) simRack(ctx context.Context, arg string) (string, string, error) {
	n, ok := sim.ParseRack(arg)
	if !ok {
		return "", "", usagef("sim fault network: RACK %q: want a rack's name, %s (or its switch's, %s)", untrusted.Line(arg, 80), sim.RackName(1), sim.ToRName(1))
	}
	first, last := sim.RackMachines(n, (n+1)*sim.RackSize)
	machines, err := c.simRange(ctx, "RACK", arg, first, last)
	return sim.RackName(n), machines, err
}

func (c *cli) simPDU(ctx context.Context, arg string) (string, string, error) {
	n, ok := sim.ParsePDU(arg)
	if !ok {
		return "", "", usagef("sim fault power: PDU %q: want a PDU's name, %s (it feeds %s and %s)", untrusted.Line(arg, 80), sim.PDUName(1), sim.RackName(2), sim.RackName(3))
	}
	first, last := sim.PDUMachines(n, (n+1)*sim.RacksPerPDU*sim.RackSize)
	machines, err := c.simRange(ctx, "PDU", arg, first, last)
	return sim.PDUName(n), machines, err
}

// simBMC resolves the target of a flaky BMC: a rack's name (its
// machines' BMCs) or a machine.
func (c *cli) simBMC(ctx context.Context, arg string) (string, string, error) {
	if n, ok := sim.ParseRack(arg); ok {
		first, last := sim.RackMachines(n, (n+1)*sim.RackSize)
		machines, err := c.simRange(ctx, "RACK", arg, first, last)
		return sim.RackName(n), machines, err
	}
	id, machines, err := c.simMachine(ctx, arg)
	var usage usageError
	if errors.As(err, &usage) {
		return "", "", usagef("sim fault bmc: MACHINE|RACK %q: no such simulated machine, and not a rack's name (%s)", untrusted.Line(arg, 80), sim.RackName(1))
	}
	return id, machines, err
}

func (c *cli) simMachine(ctx context.Context, arg string) (string, string, error) {
	id, err := c.machine(ctx, arg)
	if errors.Is(err, bmdb.ErrNotFound) {
		return "", "", usagef("sim fault machine: MACHINE %q: no such machine", untrusted.Line(arg, 80))
	}
	if err != nil {
		return "", "", err
	}
	var m bmdb.Provided
	err = c.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		m, err = tx.Provided(ctx, id)
		return err
	})
	if errors.Is(err, bmdb.ErrNotFound) || err == nil && m.Provider != sim.Name {
		return "", "", usagef("sim fault machine: MACHINE %q: not a simulated machine (provider %q)", untrusted.Line(arg, 80), untrusted.Line(m.Provider, 80))
	}
	if err != nil {
		return "", "", err
	}
	return m.ProviderID, "machine " + m.Machine.String(), nil
}

// simFaultJSON is a fault in -o json.
type simFaultJSON struct {
	Kind      string         `json:"kind"`
	Target    string         `json:"target"`
	State     string         `json:"state"`
	Params    map[string]any `json:"params,omitempty"`
	Until     *time.Time     `json:"until,omitempty"`
	Since     time.Time      `json:"since"`
	Reason    string         `json:"reason"`
	Actor     string         `json:"actor"`
	ActorRole string         `json:"actor_role"`
}

func toSimFaultJSON(f bmdb.SimFault) simFaultJSON {
	j := simFaultJSON{Kind: f.Kind, Target: f.Target, State: f.State, Params: f.Params, Since: f.Since, Reason: f.Reason, Actor: f.Actor.Name, ActorRole: f.Actor.Role}
	if !f.Until.IsZero() {
		j.Until = &f.Until
	}
	return j
}

// describeSimFault is a fault in one line of text.
func describeSimFault(f bmdb.SimFault) string {
	s := f.Kind
	if f.Target != "" {
		s += " " + f.Target
	}
	s += " " + simFaultState(f)
	if !f.Until.IsZero() {
		s += " until " + when(f.Until)
	}
	return untrusted.Line(s, 0)
}

// simFaultState is a fault's state with its parameters, as the flags
// name them: "flaky -drop 0.3 -sessions 8".
func simFaultState(f bmdb.SimFault) string {
	s := f.State
	for _, k := range slices.Sorted(maps.Keys(f.Params)) {
		if v := fmt.Sprint(f.Params[k]); v != "0" {
			s += " -" + k + " " + v
		}
	}
	return s
}

func (c *cli) simFaultInject(ctx context.Context, f bmdb.SimFault, d time.Duration, machines string) error {
	// checkOperatorText refused a reason the table could not hold or a
	// reader could not show safely.
	f.Reason = strings.TrimSpace(c.opts.reason)
	var set bmdb.SimFault
	err := c.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		set, err = tx.SetSimFault(ctx, f, d, c.actor())
		return err
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(toSimFaultJSON(set))
	}
	fmt.Fprintf(c.out, "Injected %s (%s), by %s: every replica's simulator applies it within %s\n",
		describeSimFault(set), machines, untrusted.Line(set.Actor.Name, 0), sim.FaultPollInterval)
	return nil
}

func (c *cli) simFaultEnd(ctx context.Context, kind, target string) error {
	var ended bmdb.SimFault
	var found bool
	err := c.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		ended, found, err = tx.EndSimFault(ctx, kind, target, "")
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("no %s fault on %q is in force: %w", kind, target, bmdb.ErrNotFound)
	}
	if c.json {
		return c.emitJSON(toSimFaultJSON(ended))
	}
	fmt.Fprintf(c.out, "Ended %s (injected by %s at %s)\n", describeSimFault(ended), untrusted.Line(ended.Actor.Name, 0), when(ended.Since))
	return nil
}

func (c *cli) simFaultClear(ctx context.Context) error {
	var ended []bmdb.SimFault
	err := c.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		ended, err = tx.EndSimFaults(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(ended, toSimFaultJSON))
	}
	if len(ended) == 0 {
		fmt.Fprintln(c.out, "No simulated fault was in force")
	}
	for _, f := range ended {
		fmt.Fprintf(c.out, "Ended %s (injected by %s at %s)\n", describeSimFault(f), untrusted.Line(f.Actor.Name, 0), when(f.Since))
	}
	return nil
}

func (c *cli) simFaultList(ctx context.Context) error {
	var fs []bmdb.SimFault
	err := c.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		fs, err = tx.SimFaults(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(fs, toSimFaultJSON))
	}
	var rows [][]string
	for _, f := range fs {
		until := ""
		if !f.Until.IsZero() {
			until = when(f.Until)
		}
		rows = append(rows, []string{f.Kind, f.Target, simFaultState(f), when(f.Since), until, f.Actor.Name, f.Reason})
	}
	return c.table([]string{"KIND", "TARGET", "STATE", "SINCE", "UNTIL", "ACTOR", "REASON"}, rows)
}
