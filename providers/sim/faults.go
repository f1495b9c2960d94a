package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	internalbmdb "github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/metric"
)

// Faults of the simulated fleet (docs/simulator.md). 'shepherd sim fault'
// writes them to the BMDB (table sim_fault); every replica's simulator
// reads them every FaultPollInterval and applies them to the agents it
// runs and to the BMCs it simulates, so that one command reaches every
// replica. A fault shorter than the poll interval may go unseen.

// The kinds of fault and the states they force, as sim_fault stores them.
const (
	// FaultNetwork: a rack's top-of-rack switch is down (state
	// FaultDown); its machines' agents and BMCs are unreachable.
	FaultNetwork = "network"
	// FaultPower: a PDU is off (state FaultOff); its machines and their
	// BMCs have no power, and boot anew (a new boot identity) when it
	// returns.
	FaultPower = "power"
	// FaultSite: the site is unreachable (state FaultDown, target "").
	FaultSite = "site"
	// FaultMachine: one machine's agent is silent, until a power action
	// reaches the machine (state FaultHang) or for a while, after which it
	// heartbeats again from the same boot (state FaultBlip).
	FaultMachine = "machine"

	FaultDown = "down"
	FaultOff  = "off"
	FaultHang = "hang"
	FaultBlip = "blip"
)

// FaultPollInterval is how often each replica's simulator reads the
// faults: one small query per replica.
const FaultPollInterval = time.Second

// The power actions the simulated BMCs count
// (shepherd_sim_power_actions_total).
const (
	actionReboot  = "reboot"
	actionPowerOn = "power_on"
)

// faults are the faults in force, as a replica last read them.
type faults struct {
	site     bool
	racks    map[int]bool      // racks whose network is down
	pdus     map[int]bool      // PDUs that are off
	machines map[string]string // provider id: FaultHang or FaultBlip
	// flaky and flakyRacks are the flaky BMCs (flaky.go), by machine
	// (provider id) and by rack.
	flaky      map[string]FlakyBMC
	flakyRacks map[int]FlakyBMC
}

// newFaults returns the faults fs describe; kinds this binary does not
// know (written by a newer one) are left out.
func newFaults(fs []internalbmdb.SimFault) faults {
	f := faults{racks: map[int]bool{}, pdus: map[int]bool{}, machines: map[string]string{},
		flaky: map[string]FlakyBMC{}, flakyRacks: map[int]FlakyBMC{}}
	for _, x := range fs {
		switch {
		case x.Kind == FaultSite && x.State == FaultDown:
			f.site = true
		case x.Kind == FaultNetwork && x.State == FaultDown:
			if n, ok := ParseRack(x.Target); ok {
				f.racks[n] = true
			}
		case x.Kind == FaultPower && x.State == FaultOff:
			if n, ok := ParsePDU(x.Target); ok {
				f.pdus[n] = true
			}
		case x.Kind == FaultMachine && (x.State == FaultHang || x.State == FaultBlip):
			f.machines[x.Target] = x.State
		case x.Kind == FaultBMC && x.State == FaultFlaky:
			fl, ok := flakyFromParams(x.Params)
			if !ok {
				continue
			}
			if n, isRack := ParseRack(x.Target); isRack {
				f.flakyRacks[n] = fl
			} else {
				f.flaky[x.Target] = fl
			}
		}
	}
	return f
}

func (f faults) equal(g faults) bool {
	return f.site == g.site && maps.Equal(f.racks, g.racks) && maps.Equal(f.pdus, g.pdus) && maps.Equal(f.machines, g.machines) &&
		maps.Equal(f.flaky, g.flaky) && maps.Equal(f.flakyRacks, g.flakyRacks)
}

// String lists the faults for the log.
func (f faults) String() string {
	var parts []string
	if f.site {
		parts = append(parts, "site down")
	}
	for _, n := range slices.Sorted(maps.Keys(f.racks)) {
		parts = append(parts, "network "+RackName(n)+" down")
	}
	for _, n := range slices.Sorted(maps.Keys(f.pdus)) {
		parts = append(parts, "power "+PDUName(n)+" off")
	}
	for _, m := range slices.Sorted(maps.Keys(f.machines)) {
		parts = append(parts, "machine "+m+" "+f.machines[m])
	}
	for _, n := range slices.Sorted(maps.Keys(f.flakyRacks)) {
		parts = append(parts, fmt.Sprintf("bmc %s flaky %+v", RackName(n), f.flakyRacks[n]))
	}
	for _, m := range slices.Sorted(maps.Keys(f.flaky)) {
		parts = append(parts, fmt.Sprintf("bmc %s flaky %+v", m, f.flaky[m]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// none reports whether no fault that silences agents is in force (a flaky
// BMC does not): the heartbeat round's fast path.
func (f faults) none() bool {
	return !f.site && len(f.racks) == 0 && len(f.pdus) == 0 && len(f.machines) == 0
}

// unreachable returns why the machine providerID, its agent and its BMC
// cannot be reached, or "" when they can.
func (f faults) unreachable(providerID string) string {
	d, ok := simDomains(providerID)
	return f.unreachableIn(d, ok)
}

// unreachableIn is unreachable for a machine in the domains d (ok false:
// outside the simulated topology, reached only by a site fault).
func (f faults) unreachableIn(d domains, ok bool) string {
	switch {
	case f.site:
		return "the site " + Site + " is down"
	case !ok:
		return ""
	case f.pdus[d.pdu]:
		return "the PDU " + PDUName(d.pdu) + " is off"
	case f.racks[d.rack]:
		return "the network of " + RackName(d.rack) + " is down"
	}
	return ""
}

// silent reports whether the agent ag cannot heartbeat: its machine is
// unreachable, or hangs or blips.
func (f faults) silent(ag *agent) bool {
	return f.unreachableIn(ag.domains, ag.inTopology) != "" || f.machines[ag.providerID] != ""
}

// domains are a simulated machine's rack and PDU numbers.
type domains struct{ rack, pdu int }

func simDomains(providerID string) (domains, bool) {
	i, ok := MachineIndex(providerID)
	if !ok {
		return domains{}, false
	}
	rack := i / RackSize
	return domains{rack: rack, pdu: rack / RacksPerPDU}, true
}

// errUnreachable is wrapped by the errors of power reads and actions on a
// machine whose BMC a fault makes unreachable.
var errUnreachable = errors.New("dial tcp: i/o timeout")

// newPowerActions makes shepherd_sim_power_actions_total, unregistered
// (Agents.RegisterMetrics registers it).
func newPowerActions() *prometheus.CounterVec {
	c := metric.CounterVec(nil, "shepherd_sim_power_actions_total",
		"Power actions the simulated BMCs received, by action (reboot, power_on), whether or not the BMC was reachable: a test proves with it that nothing was attempted.", "action")
	c.WithLabelValues(actionReboot)
	c.WithLabelValues(actionPowerOn)
	return c
}

// RegisterMetrics registers the simulated BMCs' metrics
// (shepherd_sim_power_actions_total, shepherd_sim_bmc_faults_total,
// shepherd_sim_bmc_max_conversations) with reg.
func (a *Agents) RegisterMetrics(reg prometheus.Registerer) error {
	if err := reg.Register(a.powerActions); err != nil {
		return fmt.Errorf("sim: registering shepherd_sim_power_actions_total: %w", err)
	}
	return a.bmcMetrics.register(reg)
}

// powerAction counts a power action the simulated BMC of m received and
// opens its conversation (converse): the caller closes it with end.
func (a *Agents) powerAction(m bmdb.Provided, action string) (end func(), err error) {
	a.powerActions.WithLabelValues(action).Inc()
	return a.converse(m)
}

// endMachineFault ends the hang or blip of m, if this replica sees one:
// a power action reached the machine, which boots anew. The fault's row
// goes first, so that no replica keeps the machine silent after the
// reboot; the faults read before this are not applied (faultEpoch).
func (a *Agents) endMachineFault(ctx context.Context, m bmdb.Provided) error {
	a.mu.Lock()
	state := a.faults.machines[m.ProviderID]
	a.mu.Unlock()
	if state == "" || !a.pollFaults {
		return nil
	}
	err := a.transactFaults(ctx, func(ctx context.Context, tx *internalbmdb.Tx) error {
		_, _, err := tx.EndSimFault(ctx, FaultMachine, m.ProviderID, state)
		return err
	})
	if err != nil {
		return fmt.Errorf("sim: ending the %s of %s: %w", state, m.ProviderID, err)
	}
	a.mu.Lock()
	delete(a.faults.machines, m.ProviderID)
	a.faultEpoch++
	a.mu.Unlock()
	klog.FromContext(ctx).Info("Simulated fault ended by a power action", "provider_id", m.ProviderID, "fault", state)
	return nil
}

// startRefused returns why an agent cannot be started on m now (a fault
// makes it unreachable, or it hangs or blips), or nil.
func (a *Agents) startRefused(m bmdb.Provided) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if why := a.faults.unreachable(m.ProviderID); why != "" {
		return fmt.Errorf("sim: agent start failed: ssh: connect: no route to host (simulated fault: %s)", why)
	}
	if state := a.faults.machines[m.ProviderID]; state != "" {
		return fmt.Errorf("sim: agent start failed: ssh: connection timed out (simulated fault: the machine is in a %s)", state)
	}
	return nil
}

// transactFaults runs fn in a transaction of the machinery behind a.db:
// the fault table is the simulator's, written by 'shepherd sim fault',
// and its statements are the machinery's, not a process author's.
func (a *Agents) transactFaults(ctx context.Context, fn func(ctx context.Context, tx *internalbmdb.Tx) error) error {
	db, ok := internalbmdb.Machinery(a.db)
	if !ok {
		return errors.New("sim: faults need the BMDB Shepherd opened")
	}
	return db.Transact(ctx, fn)
}

// runFaults reads the faults every FaultPollInterval until ctx is done.
// A failed read is logged; the faults last read stay in force.
func (a *Agents) runFaults(ctx context.Context) {
	tick := time.NewTicker(FaultPollInterval)
	defer tick.Stop()
	for {
		if err := a.readFaults(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Reading the simulated faults failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// readFaults reads the faults from the BMDB and applies them, unless a
// power action changed them locally meanwhile (the next read applies).
func (a *Agents) readFaults(ctx context.Context) error {
	a.mu.Lock()
	epoch := a.faultEpoch
	a.mu.Unlock()
	var fs []internalbmdb.SimFault
	err := a.transactFaults(ctx, func(ctx context.Context, tx *internalbmdb.Tx) error {
		var err error
		fs, err = tx.SimFaults(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("sim: reading the simulated faults: %w", err)
	}
	f := newFaults(fs)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.faultEpoch != epoch {
		return nil
	}
	changed := !f.equal(a.faults)
	a.faults = f
	// A machine without power ends its boot: when power returns, its
	// agent heartbeats from a new one (bootLocked).
	for id, ag := range a.agents {
		if len(f.pdus) > 0 && ag.inTopology && f.pdus[ag.domains.pdu] {
			delete(a.boots, id)
		}
	}
	// A flaky BMC whose fault ended forgets the commands it counted: the
	// next flaky fault freezes it after its own count.
	for id, st := range a.bmcs {
		if _, ok := f.flakyFor(id); !ok {
			st.flaky, st.commands = FlakyBMC{}, 0
		}
	}
	if changed {
		klog.FromContext(ctx).Info("Simulated faults in force", "faults", f.String())
	}
	return nil
}
