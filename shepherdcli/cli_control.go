package shepherdcli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Operator control of single machines: run-now, cancel and explain (issue
// 28). The requests are rows in the BMDB (internal/bmdb/control.go), so that
// whichever replica claims or holds the machine honours them.

// controlOptions are the flags of run-now, cancel and explain (-as and
// the selections are cli_holds.go's).
type controlOptions struct {
	hold     bool
	withdraw bool
	// explain's view of the daemons' settings of the -process it names.
	budget                  string
	maxInFlight, maxPerHour int
}

func runNowFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	asFlag(fs, o)
	fs.BoolVar(&o.ctl.withdraw, "withdraw", false, "withdraw the pending request instead (no -reason needed): one its process will not honour soon, or made by mistake")
}

func explainFlags(fs *flag.FlagSet, o *cliOptions) {
	fs.StringVar(&o.process, "process", "", "only this process (label or BMDB name); default every process of this binary")
	fs.StringVar(&o.ctl.budget, "machine_budget", "", "with -process: the daemons' -<p>_machine_budget (N/DURATION or none), to judge the budget by; default the process's default budget")
	fs.IntVar(&o.ctl.maxInFlight, "max_in_flight", 0, "with -process: the daemons' -<p>_max_in_flight, to judge the limit by (0 = not judged)")
	fs.IntVar(&o.ctl.maxPerHour, "max_per_hour", 0, "with -process: the daemons' -<p>_max_per_hour, to judge the limit by (0 = not judged)")
}

func cancelFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	fs.StringVar(&o.process, "process", "", "with a selection: the process whose leases to cancel (label or BMDB name)")
	selectionFlags(fs, o) // -as among them
	fs.BoolVar(&o.ctl.hold, "hold", false, "also hold the machine for the process, in the same transaction, so that it is not claimed again at once (shepherd release undoes it)")
}

// actor is who runs the command (operatorActor: -as, else
// $SHEPHERD_OPERATOR, else the OS user and host).
func (c *cli) actor() bmdb.Actor { return operatorActor(c.opts.hold.as) }

// explainProcesses are the binary's processes, for ExplainMachine; with
// only, the one named.
func (c *cli) explainProcesses(only string) []operator.ExplainProcess {
	var out []operator.ExplainProcess
	for _, p := range c.knownProcesses() {
		if only != "" && p.process.Name != only {
			continue
		}
		out = append(out, p.explainProcess())
	}
	if len(out) == 0 && only != "" {
		out = append(out, operator.ExplainProcess{Process: bmdb.Process{Name: only}})
	}
	return out
}

// runNow asks a process to act on a machine once, whatever its condition
// (or, with -withdraw, takes the request back).
func (c *cli) runNow(ctx context.Context, args []string) error {
	if !c.opts.ctl.withdraw && strings.TrimSpace(c.opts.reason) == "" {
		return usagef("run-now needs -reason: it is recorded for whoever looks at this next")
	}
	id, p, err := c.machineAndProcess(ctx, args)
	if err != nil {
		return err
	}
	if c.opts.ctl.withdraw {
		if err := c.db.WithdrawRun(ctx, id, p.process.Name); err != nil {
			return err
		}
		if c.json {
			return c.emitJSON(struct {
				Machine   uuid.UUID `json:"machine"`
				Process   string    `json:"process"`
				Withdrawn bool      `json:"withdrawn"`
			}{id, p.process.Name, true})
		}
		fmt.Fprintf(c.out, "Withdrew the pending run-now request of %s on %s\n", p.process.Name, id)
		return nil
	}
	res, err := c.db.RequestRun(ctx, id, p.process.Name, c.opts.reason, c.actor())
	if err != nil {
		return err
	}
	// What could keep it waiting, as the next claim will see it.
	ex, err := c.db.ExplainMachine(ctx, id, c.explainProcessesFor(p))
	if err != nil {
		return err
	}
	e := ex.Processes[0]
	blocks := blockingReasons(e)
	if c.json {
		return c.emitJSON(struct {
			Machine  uuid.UUID `json:"machine"`
			Process  string    `json:"process"`
			Replaced bool      `json:"replaced"`
			Waiting  []string  `json:"waiting_for"`
		}{id, p.process.Name, res.Replaced, blocks})
	}
	verb := "Requested"
	if res.Replaced {
		verb = "Replaced the pending request:"
	}
	if len(blocks) == 0 {
		fmt.Fprintf(c.out, "%s %s on %s now: its next claim leases it once, whether or not its condition holds (Forced, then Started, in its history)\n", verb, p.process.Name, id)
		return nil
	}
	c.printf("%s %s on %s. The request waits (shepherd explain %s shows it pending) while:\n", verb, p.process.Name, id, args[0])
	for _, b := range blocks {
		fmt.Fprintf(c.out, "  - %s\n", untrusted.Line(b, 0))
	}
	return nil
}

// explainProcessesFor is p as ExplainMachine takes it.
func (c *cli) explainProcessesFor(p cliProcess) []operator.ExplainProcess {
	return []operator.ExplainProcess{p.explainProcess()}
}

// explainProcess is p as ExplainMachine takes it: its condition, default
// budget, and its definition's Explain for the facts its condition read.
func (p cliProcess) explainProcess() operator.ExplainProcess {
	return operator.ExplainProcess{Process: p.process, Candidates: p.candidates, Limits: bmdb.Limits{MachineBudget: p.budget}, Facts: p.explain}
}

// blockingReasons are the reasons of e that keep a run-now request
// waiting: everything but the condition (which the request overrides)
// and the informational lines.
func blockingReasons(e operator.Explanation) []string {
	out := []string{}
	for _, r := range e.Reasons {
		switch {
		case strings.HasPrefix(r, "condition "),
			strings.HasPrefix(r, "run-now pending"),
			strings.HasPrefix(r, "due now"),
			strings.HasPrefix(r, "next due"),
			strings.HasPrefix(r, "budget used:") && !strings.Contains(r, "exhausted"),
			strings.HasPrefix(r, "cancel of its lease"),
			strings.HasPrefix(r, "no due row"):
			continue
		}
		out = append(out, r)
	}
	return out
}

// cancel asks the replica holding a lease to cancel its work: MACHINE
// PROCESS, or -process P and a selection.
func (c *cli) cancel(ctx context.Context, args []string) error {
	switch {
	case len(args) == 0:
		return c.cancelSelection(ctx)
	case len(args) != 2:
		return usagef("usage: shepherd cancel MACHINE PROCESS -reason R, or shepherd cancel -process P -location PATH|-state S|-cause TEXT -reason R [-yes]")
	case !c.selector("").Empty() || c.opts.process != "":
		return usagef("cancel: give MACHINE PROCESS or -process P with a selection, not both")
	}
	id, p, err := c.machineAndProcess(ctx, args)
	if err != nil {
		return err
	}
	actor := c.actor()
	var also func(ctx context.Context, tx *bmdb.Tx) error
	if c.opts.ctl.hold {
		also = func(ctx context.Context, tx *bmdb.Tx) error {
			_, err := (&operator.Tx{Tx: tx}).Hold(ctx, []uuid.UUID{id}, p.process.Name, c.opts.reason, 0, actor)
			return err
		}
	}
	res, err := c.db.RequestCancel(ctx, id, p.process.Name, c.opts.reason, actor, also)
	if err != nil {
		return err
	}
	c.warnOlderSessions(ctx)
	if c.json {
		return c.emitJSON(cancelJSON{Machine: id, Process: p.process.Name, Requested: true, Session: res.Session,
			Replica: res.Replica, LeaseStarted: res.LeaseStarted, Held: c.opts.ctl.hold})
	}
	fmt.Fprintf(c.out, "Asked the replica holding %s's lease on %s (session %s, %s, since %s) to cancel it: it ends Canceled within seconds, with no backoff added\n",
		p.process.Name, id, res.Session, untrusted.Line(res.Replica, 0), when(res.LeaseStarted))
	if c.opts.ctl.hold {
		c.printf("Held %s for %s until released: shepherd release %s -process %s -reason R\n", id, p.process.Name, args[0], args[1])
	}
	return nil
}

// cancelSelection cancels the leases of -process on the selected
// machines, in one transaction; machines it holds no lease on are listed
// and skipped.
func (c *cli) cancelSelection(ctx context.Context) error {
	process, err := c.processFlag()
	if err != nil {
		return err
	}
	if process == "" {
		return usagef("cancel: give MACHINE PROCESS, or -process P with a selection (-location, -state, -cause)")
	}
	ms, err := c.selectMachines(ctx, nil, process, "cancel")
	if err != nil {
		return err
	}
	actor := c.actor()
	var also func(ctx context.Context, tx *bmdb.Tx, requested []uuid.UUID) error
	if c.opts.ctl.hold {
		also = func(ctx context.Context, tx *bmdb.Tx, requested []uuid.UUID) error {
			_, err := (&operator.Tx{Tx: tx}).Hold(ctx, requested, process, c.opts.reason, 0, actor)
			return err
		}
	}
	outs, err := c.db.RequestCancels(ctx, machineIDs(ms), process, c.opts.reason, actor, also)
	if err != nil {
		return err
	}
	c.warnOlderSessions(ctx)
	names := map[uuid.UUID]string{}
	for _, m := range ms {
		names[m.Machine] = machineName(m)
	}
	if c.json {
		return c.emitJSON(jsonList(outs, func(o operator.CancelOutcome) cancelJSON {
			return cancelJSON{Machine: o.Machine, Process: process, Requested: o.Requested, Session: o.Session,
				Replica: o.Replica, LeaseStarted: o.LeaseStarted, Held: o.Requested && c.opts.ctl.hold}
		}))
	}
	n := 0
	for _, o := range outs {
		if !o.Requested {
			fmt.Fprintf(c.out, "%s: %s holds no lease on it; nothing to cancel\n", names[o.Machine], process)
			continue
		}
		n++
		fmt.Fprintf(c.out, "%s: asked session %s (%s) to cancel its lease\n", names[o.Machine], o.Session, untrusted.Line(o.Replica, 0))
	}
	fmt.Fprintf(c.out, "Asked to cancel %d lease(s) of %s; each ends Canceled within seconds, with no backoff added\n", n, process)
	if c.opts.ctl.hold && n > 0 {
		fmt.Fprintf(c.out, "Held those %d machine(s) for %s until released\n", n, process)
	}
	return nil
}

// cancelJSON is a cancel request in JSON.
type cancelJSON struct {
	Machine      uuid.UUID `json:"machine"`
	Process      string    `json:"process"`
	Requested    bool      `json:"requested"`
	Session      uuid.UUID `json:"session"`
	Replica      string    `json:"replica"`
	LeaseStarted time.Time `json:"lease_started"`
	Held         bool      `json:"held"`
}

// explain says, per process, whether it would act on a machine and why not.
func (c *cli) explain(ctx context.Context, args []string) error {
	id, err := c.machine(ctx, args[0])
	if err != nil {
		return err
	}
	only := ""
	if c.opts.process != "" {
		p, err := c.process(c.opts.process)
		if err != nil {
			return err
		}
		only = p.process.Name
	}
	ctl := c.opts.ctl
	if only == "" && (ctl.budget != "" || ctl.maxInFlight != 0 || ctl.maxPerHour != 0) {
		return usagef("-machine_budget, -max_in_flight and -max_per_hour are one process's settings: give -process too")
	}
	if ctl.maxInFlight < 0 || ctl.maxPerHour < 0 {
		return usagef("-max_in_flight and -max_per_hour must not be negative (0 = not judged)")
	}
	procs := c.explainProcesses(only)
	if only != "" {
		procs[0].Limits.MaxInFlight, procs[0].Limits.MaxPerHour = ctl.maxInFlight, ctl.maxPerHour
		if ctl.budget != "" {
			b, err := controlloop.ParseMachineBudget(ctl.budget)
			if err != nil {
				return usagef("-machine_budget: %v", err)
			}
			procs[0].Limits.MachineBudget = b
		}
	}
	ex, err := c.db.ExplainMachine(ctx, id, procs)
	if err != nil {
		return err
	}
	power, err := c.powerOf(ctx, id)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(explainJSON{MachineExplanation: ex, Power: power})
	}
	names, err := c.db.ProviderIDs(ctx, []uuid.UUID{id})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "Machine %s at %s\n", machineName(operator.SelectedMachine{Machine: id, ProviderID: names[id]}), when(ex.Now))
	switch {
	case ex.AgentStartedAt == nil:
		fmt.Fprintf(c.out, "  agent: none started\n")
	case ex.LastHeartbeat == nil:
		fmt.Fprintf(c.out, "  agent: started %s (%s ago), never heartbeated\n", when(*ex.AgentStartedAt), ex.Now.Sub(*ex.AgentStartedAt).Round(time.Second))
	default:
		fmt.Fprintf(c.out, "  agent: started %s; last heartbeat %s (%s ago)\n", when(*ex.AgentStartedAt), when(*ex.LastHeartbeat), ex.Now.Sub(*ex.LastHeartbeat).Round(time.Second))
	}
	c.printPower(power, ex.Now)
	if r := ex.Reset; r != nil {
		fmt.Fprintf(c.out, "  reset: %s, awaiting a heartbeat of a new boot until %s", when(r.ResetAt), when(r.VerifyBy))
		if r.NotRecoveredAt != nil {
			fmt.Fprintf(c.out, " (not back: NotRecovered recorded %s)", when(*r.NotRecoveredAt))
		}
		fmt.Fprintln(c.out)
	}
	for _, e := range ex.Processes {
		verdict := "would act at its next claim"
		if !e.WouldAct {
			verdict = "will not act now"
		}
		fmt.Fprintf(c.out, "%s: %s\n", e.Process, verdict)
		for _, r := range e.Reasons {
			fmt.Fprintf(c.out, "  - %s\n", untrusted.Line(r, 0))
		}
	}
	return nil
}

// warnOlderSessions tells the operator, on stderr, when live replicas of
// an older schema may not honour the hold or cancel just recorded (a
// rolling upgrade under way). Failing to look costs only the warning.
func (c *cli) warnOlderSessions(ctx context.Context) {
	sessions, total, err := migrate.OlderSessions(ctx, c.db.DB)
	if err != nil {
		fmt.Fprintf(c.errOut, "warning: %v\n", err)
		return
	}
	if w := migrate.OlderSessionsWarning(sessions, total); w != "" {
		fmt.Fprintln(c.errOut, w)
	}
}
