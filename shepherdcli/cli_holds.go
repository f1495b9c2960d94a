package shepherdcli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Holds, releases and selections (issue 28, items 1, 5 and 6): shepherd
// hold and release, and the selection flags that hold, release, retry and
// backoff clear (and cancel) take instead of machine names. Every command
// acts in one transaction, on at most operator.MaxHoldBatch machines.

// holdOptions are the flags of hold, release and the selections.
type holdOptions struct {
	as       string
	forDur   time.Duration
	location string
	cause    string
	yes      bool
}

// maxHoldFor bounds -for: a hold meant to last longer is a hold until
// released.
const maxHoldFor = 90 * 24 * time.Hour

// asFlag registers -as, the operator's name recorded with the action.
func asFlag(fs *flag.FlagSet, o *cliOptions) {
	fs.StringVar(&o.hold.as, "as", "", "who is acting, recorded with the action (default $SHEPHERD_OPERATOR, else the OS user@host); the database role is recorded too")
}

// selectionFlags registers the flags that select machines instead of
// naming them.
func selectionFlags(fs *flag.FlagSet, o *cliOptions) {
	fs.StringVar(&o.hold.location, "location", "", "select the machines at this location at their provider or under it, by whole path components: dc1/rack07 selects dc1/rack07 and dc1/rack07/..., not dc1/rack070")
	fs.StringVar(&o.state, "state", "", "with -process: select the machines in this state of the process: leased, backoff, rescheduled or held")
	fs.StringVar(&o.hold.cause, "cause", "", "select the machines whose last failure cause (their backoff's, of -process when given) contains this text (case-insensitive)")
	fs.BoolVar(&o.hold.yes, "yes", false, "act when the selection has more than one machine (without it, the command lists them and does nothing)")
	asFlag(fs, o)
}

func holdFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	fs.StringVar(&o.process, "process", "", "hold the machines for this process only (label or BMDB name); default every process")
	fs.DurationVar(&o.hold.forDur, "for", 0, "release the hold by itself after this long (e.g. 2h); default until 'shepherd release'")
	selectionFlags(fs, o)
}

func releaseFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	fs.StringVar(&o.process, "process", "", "release only the holds for this process (label or BMDB name); default every hold of the machines, budget holds included")
	selectionFlags(fs, o)
}

func retryFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	fs.StringVar(&o.process, "process", "", "with a selection: the process to retry (label or BMDB name)")
	selectionFlags(fs, o)
}

func backoffFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	fs.StringVar(&o.process, "process", "", "with a selection: clear the backoffs of this process only (label or BMDB name); default every process")
	selectionFlags(fs, o)
}

// operatorActor is who runs a command: as (-as), else $SHEPHERD_OPERATOR,
// else the OS user and host. The BMDB records the database role
// (session_user) beside it: a role per operator gives an identity the
// command line cannot choose.
func operatorActor(as string) bmdb.Actor {
	name := strings.TrimSpace(as)
	if name == "" {
		name = strings.TrimSpace(os.Getenv("SHEPHERD_OPERATOR"))
	}
	if name == "" {
		u := "unknown"
		if cur, err := user.Current(); err == nil && cur.Username != "" {
			u = cur.Username
		}
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown"
		}
		name = u + "@" + host
	}
	return bmdb.Actor{Name: untrusted.Line(name, 200)}
}

// selector is the command line's selection; Process is set by the caller.
func (c *cli) selector(process string) operator.Selector {
	return operator.Selector{Location: c.opts.hold.location, Process: process, State: operator.State(c.opts.state), Cause: c.opts.hold.cause}
}

// selectMachines resolves the machines a command acts on: those named in
// args, or those its selection flags pick (process is the resolved
// -process, "" for none), and prints how many and which. A selection of
// more than one machine needs -yes: without it the command stops here
// with a usage error, having listed them. verb names the action for the
// messages ("hold"); a release selects only the machines it would
// release (held for process, or at all without one), so that its count
// and -yes are about them.
func (c *cli) selectMachines(ctx context.Context, args []string, process, verb string) ([]operator.SelectedMachine, error) {
	sel := c.selector(process)
	sel.Released = verb == "release"
	switch {
	case len(args) > 0 && !sel.Empty():
		return nil, usagef("%s: give machines or a selection (-location, -process P -state S, -cause), not both", verb)
	case len(args) == 0 && sel.Empty():
		return nil, usagef("%s: give machines, or a selection: -location PATH, -process P -state S, -cause TEXT", verb)
	case sel.Location != "" && strings.Trim(sel.Location, "/") == "":
		return nil, usagef("-location %q: give a location's path components, e.g. dc1 or dc1/rack07", sel.Location)
	case sel.State != "" && process == "":
		return nil, usagef("-state %q: give -process too (the state of which process?)", sel.State)
	case sel.State != "" && !slices.Contains(operator.SelectableStates, sel.State):
		return nil, usagef("-state %q: want one of %s", sel.State, joinStates(operator.SelectableStates))
	}
	var out []operator.SelectedMachine
	if len(args) > 0 {
		if len(args) > operator.MaxHoldBatch {
			return nil, usagef("%s: %d machines: at most %d in one command", verb, len(args), operator.MaxHoldBatch)
		}
		seen := map[uuid.UUID]bool{}
		for _, a := range args {
			id, err := c.machine(ctx, a)
			if err != nil {
				return nil, err
			}
			if !seen[id] {
				seen[id] = true
				out = append(out, operator.SelectedMachine{Machine: id, ProviderID: a})
			}
		}
		return out, nil
	}
	sel.Limit = operator.MaxHoldBatch + 1
	out, err := c.db.SelectMachines(ctx, sel)
	if err != nil {
		return nil, err
	}
	switch {
	case len(out) == 0:
		return nil, fmt.Errorf("no machine matches the selection: %w", bmdb.ErrNotFound)
	case len(out) > operator.MaxHoldBatch:
		return nil, usagef("%s: the selection has more than %d machines, the most one command acts on: narrow it (a deeper -location, -cause)", verb, operator.MaxHoldBatch)
	}
	// The list goes to stderr with -o json, whose stdout is the result.
	w := c.out
	if c.json {
		w = c.errOut
	}
	fmt.Fprintf(w, "Selected %d machine(s): %s\n", len(out), selectionList(out))
	if len(out) > 1 && !c.opts.hold.yes {
		return nil, usagef("%s: %d machines selected (listed above); add -yes to act on all of them", verb, len(out))
	}
	return out, nil
}

// maxListed is how many selected machines a command names: a selection
// of thousands named in full floods the terminal with one line.
const maxListed = 20

// selectionList names the first maxListed machines of a selection, and
// how many more there are.
func selectionList(ms []operator.SelectedMachine) string {
	names := make([]string, 0, maxListed)
	for _, m := range ms[:min(len(ms), maxListed)] {
		names = append(names, machineName(m))
	}
	list := strings.Join(names, ", ")
	if more := len(ms) - maxListed; more > 0 {
		list += fmt.Sprintf(", ... and %d more", more)
	}
	return list
}

// machineName is a selected machine as the operator knows it: its
// provider id, with the UUID.
func machineName(m operator.SelectedMachine) string {
	if m.ProviderID == "" || m.ProviderID == m.Machine.String() {
		return m.Machine.String()
	}
	return untrusted.Line(m.ProviderID, 0) + " (" + m.Machine.String() + ")"
}

func machineIDs(ms []operator.SelectedMachine) []uuid.UUID {
	ids := make([]uuid.UUID, len(ms))
	for i, m := range ms {
		ids[i] = m.Machine
	}
	return ids
}

// processFlag resolves -process ("" when not given).
func (c *cli) processFlag() (string, error) {
	if c.opts.process == "" {
		return "", nil
	}
	p, err := c.process(c.opts.process)
	if err != nil {
		return "", err
	}
	return p.process.Name, nil
}

// holdJSON is a hold in JSON.
type holdJSON struct {
	Machine    uuid.UUID  `json:"machine"`
	ProviderID string     `json:"provider_id,omitempty"`
	Process    string     `json:"process"`
	Reason     string     `json:"reason"`
	Until      *time.Time `json:"until,omitempty"`
	HeldAt     time.Time  `json:"held_at"`
	Actor      string     `json:"actor"`
	ActorRole  string     `json:"actor_role"`
	Source     string     `json:"source"`
}

func toHoldJSON(h operator.Hold) holdJSON {
	j := holdJSON{Machine: h.Machine, ProviderID: h.ProviderID, Process: h.Process, Reason: h.Reason, HeldAt: h.HeldAt,
		Actor: h.Actor.Name, ActorRole: h.Actor.Role, Source: h.Source}
	if !h.Until.IsZero() {
		j.Until = &h.Until
	}
	return j
}

// forWhom names a hold's process for text output.
func forWhom(process string) string {
	if process == "" {
		return "every process"
	}
	return process
}

func (c *cli) hold(ctx context.Context, args []string) error {
	d := c.opts.hold.forDur
	// -for 0 is refused rather than read as "until released": a typo or
	// an unset variable (-for ${D}s) would hold the machines forever.
	if (c.given["for"] && d <= 0) || d < 0 || d > maxHoldFor {
		return usagef("-for %s: must be above 0 and at most %s (omit -for to hold until released)", d, maxHoldFor)
	}
	process, err := c.processFlag()
	if err != nil {
		return err
	}
	ms, err := c.selectMachines(ctx, args, process, "hold")
	if err != nil {
		return err
	}
	held, err := c.db.Hold(ctx, machineIDs(ms), process, c.opts.reason, d, operatorActor(c.opts.hold.as))
	if err != nil {
		return err
	}
	c.warnOlderSessions(ctx)
	if c.json {
		return c.emitJSON(jsonList(held, toHoldJSON))
	}
	until := renamed(c.prog, "until released (shepherd release)")
	if d > 0 && len(held) > 0 {
		until = "until " + when(held[0].Until)
	}
	fmt.Fprintf(c.out, "Held %d machine(s) for %s, %s; no replica leases them for it from its next claim on, work in flight runs to its end\n", len(held), forWhom(process), until)
	return nil
}

func (c *cli) release(ctx context.Context, args []string) error {
	process, err := c.processFlag()
	if err != nil {
		return err
	}
	ms, err := c.selectMachines(ctx, args, process, "release")
	if err != nil {
		return err
	}
	released, err := c.db.Release(ctx, machineIDs(ms), process, c.opts.reason, operatorActor(c.opts.hold.as))
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(released, toHoldJSON))
	}
	if len(released) == 0 {
		return fmt.Errorf("no hold of %s on the %d machine(s): %w", forWhom(process), len(ms), bmdb.ErrNotFound)
	}
	for _, h := range released {
		fmt.Fprintf(c.out, "Released %s for %s (held by %s since %s, %s: %s)\n", machineName(operator.SelectedMachine{Machine: h.Machine, ProviderID: h.ProviderID}),
			forWhom(h.Process), untrusted.Line(h.Actor.Name, 0), when(h.HeldAt), h.Source, untrusted.Line(h.Reason, 0))
	}
	return nil
}

// retryCmd is retry MACHINE PROCESS, or retry of a selection (-process
// names the process then).
func (c *cli) retryCmd(ctx context.Context, args []string) error {
	ctx = bmdb.WithActor(ctx, operatorActor(c.opts.hold.as))
	if len(args) > 0 {
		if len(args) != 2 {
			return usagef("usage: shepherd retry MACHINE PROCESS -reason R, or shepherd retry -process P (-state S | -location PATH | -cause TEXT) -reason R [-yes]")
		}
		if !c.selector("").Empty() || c.opts.process != "" {
			return usagef("retry: give MACHINE PROCESS or a selection with -process, not both")
		}
		return c.retry(ctx, args)
	}
	process, err := c.processFlag()
	if err != nil {
		return err
	}
	if process == "" {
		return usagef("retry with a selection: give -process, the process to retry")
	}
	ms, err := c.selectMachines(ctx, nil, process, "retry")
	if err != nil {
		return err
	}
	res, err := c.db.RetryMachines(ctx, machineIDs(ms), process, c.opts.reason)
	if err != nil {
		return err
	}
	type retried struct {
		Machine         uuid.UUID `json:"machine"`
		Process         string    `json:"process"`
		BackoffEnded    bool      `json:"backoff_ended"`
		RescheduleEnded bool      `json:"reschedule_ended"`
		Leased          bool      `json:"leased"`
	}
	var out []retried
	ended, rescheduled := 0, 0
	for _, m := range ms {
		if r, ok := res[m.Machine]; ok {
			out = append(out, retried{m.Machine, process, r.BackoffEnded, r.RescheduleEnded, r.Leased})
			if r.BackoffEnded {
				ended++
			}
			if r.RescheduleEnded {
				rescheduled++
			}
		}
	}
	if c.json {
		return c.emitJSON(jsonList(out, func(r retried) retried { return r }))
	}
	held, err := c.heldAmong(ctx, ms, process)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "Retried %s on %d machine(s), ending %d backoff(s) and %d check-again-later time(s); each is eligible now if %s's condition holds and it is not held\n", process, len(out), ended, rescheduled, process)
	if len(held) > 0 {
		c.printf("%d of them are held for %s (escalated by its budget, or by an operator), which a retry does not lift: %s; shepherd release them (-process %s) to let it act\n",
			len(held), process, selectionList(held), process)
	}
	return nil
}

// heldAmong returns the machines of ms held for process (by its own holds
// or holds of every process).
func (c *cli) heldAmong(ctx context.Context, ms []operator.SelectedMachine, process string) ([]operator.SelectedMachine, error) {
	holds, err := c.db.HoldsAmong(ctx, machineIDs(ms))
	if err != nil {
		return nil, err
	}
	var out []operator.SelectedMachine
	for _, m := range ms {
		if slices.ContainsFunc(holds[m.Machine], func(h operator.Hold) bool { return h.Process == process || h.Process == "" }) {
			out = append(out, m)
		}
	}
	return out, nil
}

// backoffCmd is backoff clear MACHINE [PROCESS], or backoff clear of a
// selection.
func (c *cli) backoffCmd(ctx context.Context, args []string) error {
	ctx = bmdb.WithActor(ctx, operatorActor(c.opts.hold.as))
	if args[0] != "clear" {
		return usagef("backoff %q: the only backoff action is clear", args[0])
	}
	if len(args) > 1 {
		if !c.selector("").Empty() || c.opts.process != "" {
			return usagef("backoff clear: give MACHINE [PROCESS] or a selection, not both")
		}
		return c.backoffClear(ctx, args)
	}
	process, err := c.processFlag()
	if err != nil {
		return err
	}
	ms, err := c.selectMachines(ctx, nil, process, "backoff clear")
	if err != nil {
		return err
	}
	cleared, err := c.db.ClearBackoffs(ctx, machineIDs(ms), process, c.opts.reason)
	if err != nil {
		return err
	}
	var out []clearedJSON
	for _, m := range ms {
		for _, b := range cleared[m.Machine] {
			out = append(out, clearedJSON{m.Machine, b.Process, b.Until, b.Cause, int64(b.LastInterval / time.Second), b.WasActive})
		}
	}
	if c.json {
		return c.emitJSON(jsonList(out, func(j clearedJSON) clearedJSON { return j }))
	}
	if len(out) == 0 {
		return fmt.Errorf("no backoff to clear on the %d machine(s): %w", len(ms), bmdb.ErrNotFound)
	}
	fmt.Fprintf(c.out, "Cleared %d backoff(s) on %d machine(s); the next failure backs off from the initial interval again\n", len(out), len(cleared))
	return nil
}
