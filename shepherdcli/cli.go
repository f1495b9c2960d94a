package shepherdcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/migrate"

	"github.com/google/uuid"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// exitNotFound is the status of an operator command whose machine, backoff
// or pause does not exist, so that a script can tell "nothing to do" from
// a failure.
const exitNotFound = 3

// cliUsage documents the operator commands.
const cliUsage = `Operator commands, talking to the BMDB (-bmdb_dsn, -bmdb_dsn_file or
$SHEPHERD_BMDB_DSN; without them, the demo running in -state_dir):

  shepherd machines [-process P] [-state eligible|leased|backoff|rescheduled|held] [-limit N]
      machines per process and state: leases (oldest first), backoffs (with
      cause and until), rescheduled machines (done for now: checked again
      at until), holds, eligible machines (by id)
  shepherd machines -all [-limit N]
      every machine: provider, provider id, address, location, agent start
      and last heartbeat, and each process's state on it
  shepherd history MACHINE [-limit N]
      the machine's work history, oldest first (with -limit, the newest N);
      a machine its provider removed by its UUID or the provider id it had
  shepherd backoff clear MACHINE [PROCESS] -reason R
      delete the backoff of PROCESS (default: every process) on MACHINE; the
      next failure backs off from the initial interval again
  shepherd retry MACHINE PROCESS -reason R
      make MACHINE eligible now for PROCESS: end its backoff, keeping its
      interval (a new failure backs off longer), or its check-again-later
      time (rescheduled)
  shepherd hold MACHINE... [-process P] -reason R [-for D]
      keep P (default: every process) off the machines, on every replica,
      from its next claim on; work in flight runs to its end. -for releases
      the hold by itself after D
  shepherd release MACHINE... [-process P] -reason R
      end the holds of P (default: every hold, a budget's included)
  Selections: hold, release, retry and backoff clear (and cancel) take,
  instead of machines, -location PATH, -process P -state leased|backoff|rescheduled|held
  or -cause TEXT (in the last failure cause); they list the machines
  selected and act on more than one only with -yes, in one transaction (at
  most 10000 machines). -location matches whole path components:
  dc3/rack00 selects dc3/rack00 and dc3/rack00/..., not dc3/rack000 (for
  racks sharing a name prefix, select each rack). Operator actions record -as NAME (default
  $SHEPHERD_OPERATOR, else user@host) and the database role.
  shepherd pause PROCESS -reason R [-as NAME]
      stop every replica from leasing machines for PROCESS until resume
  shepherd resume PROCESS -reason R [-as NAME]
      lift a pause, an operator's or the circuit breaker's
  shepherd pauses [-process P] [-limit N]
      the pauses and resumes of processes, newest first: who (and the
      database role), the breaker or an operator, and why
  shepherd sessions
      worker sessions, live and expired
  shepherd hostkey forget MACHINE -reason R
      forget the SSH host key pinned for MACHINE (after a reinstall): the
      next connection pins the key the machine then presents; recorded in
      the machine's history with the reason and the key's fingerprint
  shepherd hostkey list [-limit N]
      pinned SSH host keys, with fingerprints
  shepherd tags MACHINE
      the machine's tags of the binary's processes (their own tables)
  shepherd condition PROCESS
      the process's condition as this binary defines it and as the BMDB
      records it, and whether they are the same (machines evaluates
      eligibility only when they are: it never runs SQL read from the BMDB)
  shepherd run-now MACHINE PROCESS -reason R [-as NAME]
      make PROCESS act on MACHINE once, at its next claim, even though its
      condition does not hold (recovery: reboot now; agentstart: start the
      agent again); still under exclusion, backoff, pause, limits and
      holds: the request waits while one blocks it, and says which;
      -withdraw takes a pending request back
  shepherd cancel MACHINE PROCESS -reason R [-hold] [-as NAME]
  shepherd cancel -process P -location PATH|-state S|-cause TEXT -reason R [-hold] [-yes]
      cancel PROCESS's lease on MACHINE (or on each selected machine, in one
      transaction): the replica holding it cancels the work within seconds;
      it ends Canceled, adding no backoff; -hold also holds the machine for
      PROCESS in the same transaction
  shepherd explain MACHINE [-process P [-machine_budget N/D] [-max_in_flight N] [-max_per_hour N]]
      for each process, whether it would act on MACHINE and every reason it
      will not, in the order a claim checks them; the limits are the
      daemons' flags, which the BMDB does not record: give them to judge
  shepherd sim fault KIND [TARGET] STATE [DURATION] [-reason R] | fault clear | fault list
      faults of a simulated fleet (-provider sim), on every replica within a
      second: network RACK down|up, power PDU off|on, site down|up, machine
      MACHINE hang|blip DURATION|clear (docs/simulator.md)

MACHINE is a machine's UUID or its provider id (sim-0002, a hostname).
PROCESS is a process's label (agentstart, recovery) or its BMDB name
(ShepherdRecovery). Operator actions are recorded in the machine's history
with the reason. Every command takes -o json for JSON instead of aligned
text, and flags may come before or after the arguments.

Exit status: 0 done; 1 error (database unreachable, schema mismatch, ...);
2 bad command line; 3 not found (unknown machine, no backoff to clear,
process not paused).
`

// cliCommand is one operator subcommand.
type cliCommand struct {
	args     string // positional arguments, for usage lines
	min, max int    // number of positional arguments
	// flags registers the command's own flags on fs.
	flags func(fs *flag.FlagSet, o *cliOptions)
	run   func(c *cli, ctx context.Context, args []string) error
	// reasonOptional is set for a command whose -reason only some of its
	// actions require; run checks it.
	reasonOptional bool
}

// cliOptions are the values of the commands' own flags.
type cliOptions struct {
	process string
	state   string
	limit   int
	reason  string
	all     bool
	hold    holdOptions    // hold, release and selections (cli_holds.go)
	ctl     controlOptions // run-now, cancel (cli_control.go)
	flaky   flakyOptions   // sim fault bmc ... flaky (simfault.go)
}

var cliCommands = map[string]cliCommand{
	"machines": {min: 0, max: 0, flags: func(fs *flag.FlagSet, o *cliOptions) {
		fs.StringVar(&o.process, "process", "", "only this process (label or BMDB name); default every process")
		fs.StringVar(&o.state, "state", "", "only this state: eligible, leased, backoff, rescheduled or held; default all")
		fs.IntVar(&o.limit, "limit", 1000, "at most this many machines per process and state (with -all: in all)")
		fs.BoolVar(&o.all, "all", false, "every machine, with provider, provider id, address, location, agent tags and the state of each process")
		// The processes' own flags are registered too (runCLI): their
		// eligibility depends on them, as in the daemon.
	}, run: (*cli).machines},
	"history": {args: "MACHINE", min: 1, max: 1, flags: func(fs *flag.FlagSet, o *cliOptions) {
		fs.IntVar(&o.limit, "limit", 0, "only the newest N entries (0 = all)")
	}, run: (*cli).history},
	"backoff":  {args: "clear MACHINE [PROCESS] | clear SELECTION", min: 1, max: 3, flags: backoffFlags, run: (*cli).backoffCmd},
	"retry":    {args: "MACHINE PROCESS | -process P SELECTION", min: 0, max: 2, flags: retryFlags, run: (*cli).retryCmd},
	"hold":     {args: "MACHINE... | SELECTION", min: 0, max: operator.MaxHoldBatch, flags: holdFlags, run: (*cli).hold},
	"release":  {args: "MACHINE... | SELECTION", min: 0, max: operator.MaxHoldBatch, flags: releaseFlags, run: (*cli).release},
	"pause":    {args: "PROCESS", min: 1, max: 1, flags: pauseFlags, run: (*cli).pause},
	"resume":   {args: "PROCESS", min: 1, max: 1, flags: pauseFlags, run: (*cli).resume},
	"sessions": {run: (*cli).sessions},
	"pauses": {min: 0, max: 0, flags: func(fs *flag.FlagSet, o *cliOptions) {
		fs.StringVar(&o.process, "process", "", "only this process (label or BMDB name); default every process")
		fs.IntVar(&o.limit, "limit", 100, "only the newest N pauses and resumes")
	}, run: (*cli).pauses},
	"hostkey": {args: "forget MACHINE -reason R | list", min: 1, max: 2, reasonOptional: true, flags: func(fs *flag.FlagSet, o *cliOptions) {
		reasonFlag(fs, o)
		fs.IntVar(&o.limit, "limit", 1000, "list: at most this many keys")
		asFlag(fs, o)
	}, run: (*cli).hostKey},
	"tags":      {args: "MACHINE", min: 1, max: 1, run: (*cli).tags},
	"condition": {args: "PROCESS", min: 1, max: 1, run: (*cli).condition},
	"run-now":   {args: "MACHINE PROCESS", min: 2, max: 2, flags: runNowFlags, run: (*cli).runNow, reasonOptional: true},
	"cancel":    {args: "MACHINE PROCESS | -process P SELECTION", min: 0, max: 2, flags: cancelFlags, run: (*cli).cancel},
	"explain":   {args: "MACHINE", min: 1, max: 1, flags: explainFlags, run: (*cli).explain},
	"sim":       {args: "fault KIND [TARGET] STATE [DURATION] | fault clear | fault list", min: 2, max: 5, flags: simFlags, run: (*cli).sim, reasonOptional: true},
}

// pauseFlags are pause's and resume's: a reason and an actor, recorded
// as a hold's and a release's are.
func pauseFlags(fs *flag.FlagSet, o *cliOptions) {
	reasonFlag(fs, o)
	asFlag(fs, o)
}

func reasonFlag(fs *flag.FlagSet, o *cliOptions) {
	fs.StringVar(&o.reason, "reason", "", "why (required): recorded with the action for whoever looks at it next")
}

// isCLICommand reports whether name is an operator subcommand.
func isCLICommand(name string) bool {
	_, ok := cliCommands[name]
	return ok
}

// cli is one operator command's run.
type cli struct {
	db *operator.DB
	// out gets the command's output; errOut notes about it (which
	// condition decided eligibility), which scripts reading out skip.
	out    io.Writer
	errOut io.Writer
	json   bool
	opts   cliOptions
	// givenProcessFlags are the process flags on the command line
	// (-recovery_heartbeat_timeout): eligibility then follows them
	// instead of the condition the running daemons recorded.
	givenProcessFlags []string
	// known are the binary's registered processes.
	known []cliProcess
	// prog is the program's name, in the commands the output suggests.
	prog string
	// given are the flags set on the command line, so that a value given
	// is told from the default (-for 0 from no -for).
	given map[string]bool
}

// printf writes to out a message of this package's own, whose commands
// (format's "shepherd resume %s") name the program as it is (renamed).
func (c *cli) printf(format string, args ...any) {
	fmt.Fprintf(c.out, renamed(c.prog, format), args...)
}

// runCLI runs the operator subcommand name and returns its exit status.
func (d *CLI) runCLI(name string, args []string, stdout, stderr io.Writer) int {
	cmd := cliCommands[name]
	prog := d.prog()
	fs := flag.NewFlagSet(prog+" "+name, flag.ContinueOnError)
	var dsnf dsnFlags
	dsnf.register(fs)
	output := fs.String("o", "text", "output format: text (aligned columns) or json")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on the command's database work")
	stateDir := fs.String("state_dir", defaultStateDir, "with no database given: the directory of a running demo, whose database to use")
	var opts cliOptions
	if cmd.flags != nil {
		cmd.flags(fs, &opts)
	}
	// Eligibility (machines) depends on the processes' flags, such as
	// Recovery's timeouts.
	withProcessFlags := name == "machines" || name == "explain" || name == "run-now"
	processFlags := map[string]bool{}
	if withProcessFlags {
		processFlags = d.registerProcessFlags(fs)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, name, err)
		return exitFailure
	}

	positional, help, err := parseCLIArgs(fs, args)
	if help {
		fmt.Fprintf(stdout, "Usage: %s %s [flags] %s\n\n%s\nFlags:\n", prog, name, cmd.args, renamed(prog, cliUsage))
		printDefaults(fs, prog, stdout)
		return exitOK
	}
	if err == nil {
		err = checkCLIArgs(name, cmd, fs, positional, *output, *timeout, opts)
	}
	if err != nil {
		return reportUsage(stderr, d.prog(), err)
	}
	for _, p := range d.processes {
		if withProcessFlags && p.Check != nil {
			if err := p.Check(); err != nil {
				return reportUsage(stderr, d.prog(), usageError{err.Error()})
			}
		}
	}
	dsn, err := dsnf.resolve()
	if err != nil {
		return reportUsage(stderr, d.prog(), err)
	}
	var demoDir string // the demo's state directory, when its database is used
	if dsn == "" {
		// No database named: the demo running in -state_dir, if any.
		demo, abs, err := runningDemoDSN(*stateDir)
		if err != nil {
			return fail(err)
		}
		if demo == "" {
			return reportUsage(stderr, d.prog(), usagef("%s: no database: give -bmdb_dsn, -bmdb_dsn_file or $%s (or run the demo, whose database the commands then use, in -state_dir %s)", name, envDSN, abs))
		}
		target, _ := describeDSN(demo)
		fmt.Fprintf(stderr, "%s %s: no database given; using the demo running in %s (%s)\n", prog, name, abs, target)
		dsn = demo
		demoDir = abs
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	db, err := bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: 2, QuietConnections: true})
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	if err := migrate.CheckSchema(ctx, db); err != nil {
		if demoDir != "" {
			// A demo killed with SIGKILL leaves its DSN behind.
			err = fmt.Errorf("%w (is the demo in %s still running? it may have been killed)", err, demoDir)
		}
		return fail(err)
	}
	known, err := buildProcesses(d.processes)
	if err != nil {
		return fail(err)
	}
	c := &cli{db: operator.New(db), out: stdout, errOut: stderr, json: *output == "json", opts: opts, known: known, prog: prog}
	c.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		c.given[f.Name] = true
		if processFlags[f.Name] {
			c.givenProcessFlags = append(c.givenProcessFlags, "-"+f.Name)
		}
	})
	return cliExit(cmd.run(c, ctx, positional), prog, name, stderr)
}

// cliExit reports an operator command's error, if any, on stderr, and
// returns its exit status.
func cliExit(err error, prog, name string, stderr io.Writer) int {
	var usage usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &usage):
		return reportUsage(stderr, prog, err)
	case errors.Is(err, bmdb.ErrNotFound):
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, name, err)
		return exitNotFound
	default:
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, name, err)
		return exitFailure
	}
}

// maxActorBytes bounds -as, the operator's name recorded with an action.
const maxActorBytes = 200

// checkOperatorText refuses a -reason or -as that the BMDB would store
// and every reader would show: longer than its bound, or holding control
// characters (a pasted escape sequence, a newline).
func checkOperatorText(opts cliOptions) error {
	if opts.reason != "" {
		if err := operator.CheckReason(opts.reason); err != nil {
			return usagef("-reason: %v", err)
		}
	}
	as := opts.hold.as
	switch {
	case len(as) > maxActorBytes:
		return usagef("-as: %d bytes, at most %d", len(as), maxActorBytes)
	case untrusted.Line(as, maxActorBytes) != as:
		return usagef("-as %s: it holds control characters or invalid UTF-8", untrusted.Line(as, 0))
	}
	return nil
}

// registerProcessFlags registers the processes' own flags on fs and
// returns their names.
func (d *CLI) registerProcessFlags(fs *flag.FlagSet) map[string]bool {
	before := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
	for _, p := range d.processes {
		if p.Flags != nil {
			p.Flags(fs)
		}
	}
	added := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if !before[f.Name] {
			added[f.Name] = true
		}
	})
	return added
}

// parseCLIArgs parses args with fs, flags being allowed after the
// arguments ("backoff clear M -reason R"), and returns the arguments.
func parseCLIArgs(fs *flag.FlagSet, args []string) (positional []string, help bool, err error) {
	for {
		help, err := parseFlags(fs, args)
		if help || err != nil {
			return nil, help, err
		}
		if fs.NArg() == 0 {
			return positional, false, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// checkCLIArgs checks a parsed operator command line before anything
// connects: its arguments, the common flags and the operator's text.
func checkCLIArgs(name string, cmd cliCommand, fs *flag.FlagSet, positional []string, output string, timeout time.Duration, opts cliOptions) error {
	switch {
	case len(positional) < cmd.min || len(positional) > cmd.max:
		return usagef("usage: shepherd %s [flags] %s (see shepherd %s -h)", name, cmd.args, name)
	case output != "text" && output != "json":
		return usagef("-o %q: want text or json", output)
	case timeout <= 0 || timeout > 24*time.Hour:
		return usagef("-timeout %s: must be above 0 and at most 24h", timeout)
	case opts.limit < 0:
		return usagef("-limit %d: must not be negative", opts.limit)
	case cmd.flags != nil && fs.Lookup("reason") != nil && !cmd.reasonOptional && strings.TrimSpace(opts.reason) == "":
		return usagef("%s needs -reason: it is recorded for whoever looks at this next", name)
	}
	return checkOperatorText(opts)
}

// cliProcess is a process named on the command line.
type cliProcess struct {
	label   string // "" for a process this binary does not run
	process bmdb.Process
	// candidates is nil for a process this binary does not know.
	candidates *bmdb.Candidates
	// tags reads the process's own tags of a machine; nil if it has none.
	tags func(ctx context.Context, tx bmdbapi.Tx, machine uuid.UUID) ([]controlloop.Tag, error)
	// budget is the process's default per-machine budget (explain).
	budget bmdb.MachineBudget
	// explain reads the facts of its condition (explain); nil if the
	// definition has none.
	explain func(ctx context.Context, tx bmdbapi.Tx, machine uuid.UUID) ([]bmdb.Fact, error)
}

// knownProcesses are the binary's registered processes.
func (c *cli) knownProcesses() []cliProcess { return c.known }

// buildProcesses reads the registered processes' definitions: their
// candidate conditions (after the flags), tags and budgets. Nothing is
// built: the commands act on the BMDB, not through the provider.
func buildProcesses(defs []controlloop.Definition) ([]cliProcess, error) {
	var out []cliProcess
	for _, def := range defs {
		cand, err := def.Candidates()
		if err != nil {
			return nil, fmt.Errorf("process %s: candidates: %w", def.Info.Label, err)
		}
		out = append(out, cliProcess{label: def.Info.Label, process: def.Info.Process, candidates: &cand, tags: def.Tags, budget: def.Info.DefaultMachineBudget, explain: def.Explain})
	}
	return out, nil
}

// process resolves a label or a BMDB name. A valid name this binary does
// not know (another deployment's process) is accepted: it can be paused,
// and its leases and backoffs listed.
func (c *cli) process(arg string) (cliProcess, error) {
	for _, p := range c.knownProcesses() {
		if strings.EqualFold(arg, p.label) || arg == p.process.Name {
			return p, nil
		}
	}
	p := bmdb.Process{Name: arg}
	if err := p.Validate(); err != nil {
		var labels []string
		for _, k := range c.knownProcesses() {
			labels = append(labels, k.label)
		}
		return cliProcess{}, usagef("unknown process %q: give a label (%s) or a BMDB process name", arg, strings.Join(labels, ", "))
	}
	return cliProcess{process: p}, nil
}

// machine resolves a machine named on the command line: its UUID, or its
// provider id ("sim-0002", a hostname) when that names exactly one machine.
func (c *cli) machine(ctx context.Context, arg string) (uuid.UUID, error) {
	if id, err := uuid.Parse(arg); err == nil {
		return id, nil
	}
	found, err := c.db.MachinesByProviderID(ctx, arg)
	if err != nil {
		return uuid.Nil, err
	}
	switch len(found) {
	case 0:
		return uuid.Nil, fmt.Errorf("no machine has the ID or provider id %q: %w", arg, bmdb.ErrNotFound)
	case 1:
		return found[0].Machine, nil
	}
	var matches []string
	for _, p := range found {
		matches = append(matches, fmt.Sprintf("%s (%s/%s)", p.Machine, p.Provider, p.ProviderID))
	}
	return uuid.Nil, usagef("%q names %d machines of different providers: %s; give the UUID", arg, len(found), strings.Join(matches, ", "))
}

// machineAndProcess resolves the MACHINE PROCESS arguments of the
// commands that act on one machine for one process (run-now, cancel,
// retry).
func (c *cli) machineAndProcess(ctx context.Context, args []string) (uuid.UUID, cliProcess, error) {
	id, err := c.machine(ctx, args[0])
	if err != nil {
		return uuid.Nil, cliProcess{}, err
	}
	p, err := c.process(args[1])
	if err != nil {
		return uuid.Nil, cliProcess{}, err
	}
	return id, p, nil
}

// emitJSON writes v as indented JSON whose strings hold no control
// characters: text from the BMDB (a cause from a BMC, a reason an older
// binary stored) may hold escape sequences, which encoding/json writes as
// \u001b and jq -r turns back into the raw escape. Each string is
// written as untrusted.Visible shows it (ESC as the four characters
// \x1b), so that every reader of the JSON prints it harmlessly.
func (c *cli) emitJSON(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	out, err := visibleJSONStrings(b.Bytes())
	if err != nil {
		return err
	}
	_, err = c.out.Write(untrusted.JSON(out))
	return err
}

// visibleJSONStrings rewrites each string of data, a JSON text as
// encoding/json writes it, as untrusted.Visible shows it, keeping the
// rest (order, indentation) as it is.
func visibleJSONStrings(data []byte) ([]byte, error) {
	var out []byte
	last := 0
	for i := 0; i < len(data); i++ {
		if data[i] != '"' {
			continue
		}
		end := i + 1
		for ; end < len(data) && data[end] != '"'; end++ {
			if data[end] == '\\' {
				end++
			}
		}
		if end >= len(data) {
			return nil, errors.New("writing JSON: an unterminated string")
		}
		lit := data[i : end+1]
		var s string
		if err := json.Unmarshal(lit, &s); err != nil {
			return nil, fmt.Errorf("writing JSON: %w", err)
		}
		if shown := untrusted.Visible(s); shown != s {
			enc, err := json.Marshal(shown)
			if err != nil {
				return nil, fmt.Errorf("writing JSON: %w", err)
			}
			out = append(append(out, data[last:i]...), enc...)
			last = end + 1
		}
		i = end
	}
	if out == nil {
		return data, nil
	}
	return append(out, data[last:]...), nil
}

// table writes aligned columns; empty cells print as "-".
func (c *cli) table(header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := slices.Clone(r)
		for i, cell := range cells {
			if cell == "" {
				cells[i] = "-"
			}
			// A cause with a tab or newline would break the columns, and
			// text from machines and BMCs may hold terminal escapes
			// (ESC[2J clears the operator's screen): shown escaped.
			cells[i] = untrusted.Line(strings.Join(strings.Fields(cells[i]), " "), 0)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// when is a time for the text output: UTC, to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// machineJSON is a machines row in JSON.
type machineJSON struct {
	Machine             uuid.UUID      `json:"machine"`
	ProviderID          string         `json:"provider_id,omitempty"`
	Process             string         `json:"process"`
	State               operator.State `json:"state"`
	Session             *uuid.UUID     `json:"session,omitempty"`
	Since               *time.Time     `json:"since,omitempty"`
	Until               *time.Time     `json:"until,omitempty"`
	Cause               string         `json:"cause,omitempty"`
	LastIntervalSeconds int64          `json:"last_interval_seconds,omitempty"`
	Actor               string         `json:"actor,omitempty"`
}

func (c *cli) machines(ctx context.Context, args []string) error {
	if c.opts.all {
		if c.opts.process != "" || c.opts.state != "" {
			return usagef("-all lists every machine and process: give it without -process and -state")
		}
		return c.fleet(ctx)
	}
	states := operator.States
	state := operator.State(c.opts.state)
	if state != "" {
		if !slices.Contains(operator.States, state) {
			return usagef("-state %q: want one of %s", state, joinStates(operator.States))
		}
		states = []operator.State{state}
	}
	var procs []cliProcess
	if c.opts.process != "" {
		p, err := c.process(c.opts.process)
		if err != nil {
			return err
		}
		if state == "" || state == operator.StateEligible {
			if p, err = c.withRecordedCondition(ctx, p); err != nil {
				return err
			}
		}
		if state == operator.StateEligible && p.candidates == nil {
			return usagef("-state eligible: eligibility of %s is unknown: this binary does not define it, and it does not run condition SQL read from the BMDB (shepherd condition %s shows it)", p.process.Name, p.process.Name)
		}
		procs = []cliProcess{p}
	} else {
		// This binary's processes, and any other the BMDB has seen.
		procs = slices.Clone(c.knownProcesses())
		names, err := c.db.KnownProcesses(ctx)
		if err != nil {
			return err
		}
		for _, name := range names {
			if !slices.ContainsFunc(procs, func(p cliProcess) bool { return p.process.Name == name }) {
				procs = append(procs, cliProcess{process: bmdb.Process{Name: name}})
			}
		}
		if slices.Contains(states, operator.StateEligible) {
			for i := range procs {
				if procs[i], err = c.withRecordedCondition(ctx, procs[i]); err != nil {
					return err
				}
			}
		}
	}

	var rows []operator.MachineState
	for _, p := range procs {
		for _, state := range states {
			if state == operator.StateEligible && p.candidates == nil {
				continue // unknown condition; said in the -state eligible case
			}
			ms, err := c.db.Machines(ctx, operator.MachineQuery{Process: p.process, Candidates: p.candidates, State: state, Limit: c.opts.limit})
			if err != nil {
				return err
			}
			rows = append(rows, ms...)
		}
	}
	return c.printMachines(ctx, rows)
}

// printMachines writes the rows of machines, each machine named by its
// provider id beside its UUID.
func (c *cli) printMachines(ctx context.Context, rows []operator.MachineState) error {
	names, err := c.providerIDs(ctx, rows)
	if err != nil {
		return err
	}
	if c.json {
		out := make([]machineJSON, 0, len(rows))
		for _, m := range rows {
			j := machineJSON{Machine: m.Machine, ProviderID: names[m.Machine], Process: m.Process, State: m.State, Cause: m.Cause, LastIntervalSeconds: int64(m.LastInterval / time.Second)}
			if m.State == operator.StateLeased {
				j.Session, j.Since = &m.Session, &m.Since
			}
			if m.State == operator.StateBackoff || m.State == operator.StateRescheduled {
				j.Until = &m.Until
			}
			if m.State == operator.StateHeld {
				j.Since, j.Actor = &m.Since, m.Actor.Name
				if !m.Until.IsZero() {
					j.Until = &m.Until
				}
			}
			out = append(out, j)
		}
		return c.emitJSON(out)
	}
	var table [][]string
	for _, m := range rows {
		var interval, session string
		if m.LastInterval > 0 {
			interval = m.LastInterval.String()
		}
		if m.Session != uuid.Nil {
			session = m.Session.String()
		}
		cause := m.Cause
		if m.State == operator.StateHeld {
			cause = fmt.Sprintf("%s (by %s)", m.Cause, m.Actor.Name)
		}
		table = append(table, []string{m.Machine.String(), names[m.Machine], m.Process, string(m.State), when(m.Since), when(m.Until), interval, session, cause})
	}
	return c.table([]string{"MACHINE", "PROVIDER ID", "PROCESS", "STATE", "SINCE", "UNTIL", "INTERVAL", "SESSION", "CAUSE"}, table)
}

// providerIDs names the machines of rows as their providers know them
// (node-007): operators know machines by those, and every command takes
// them. A machine a provider removed has none.
func (c *cli) providerIDs(ctx context.Context, rows []operator.MachineState) (map[uuid.UUID]string, error) {
	ids := make([]uuid.UUID, 0, len(rows))
	seen := map[uuid.UUID]bool{}
	for _, m := range rows {
		if !seen[m.Machine] {
			seen[m.Machine] = true
			ids = append(ids, m.Machine)
		}
	}
	return c.db.ProviderIDs(ctx, ids)
}

// historyJSON is a history entry in JSON.
type historyJSON struct {
	ID         int64      `json:"id"`
	Machine    uuid.UUID  `json:"machine"`
	ProviderID string     `json:"provider_id,omitempty"`
	Process    string     `json:"process"`
	Event      bmdb.Event `json:"event"`
	Timestamp  time.Time  `json:"timestamp"`
	Cause      string     `json:"cause,omitempty"`
	Session    *uuid.UUID `json:"session,omitempty"`
	Actor      string     `json:"actor,omitempty"`
	ActorRole  string     `json:"actor_role,omitempty"`
}

func (c *cli) history(ctx context.Context, args []string) error {
	id, err := c.historyMachine(ctx, args[0])
	if err != nil {
		return err
	}
	var h []bmdb.HistoryEntry
	if c.opts.limit > 0 {
		d, err := c.db.Machine(ctx, id, c.opts.limit)
		if err != nil {
			return err
		}
		h = d.History
	} else {
		if h, err = c.db.History(ctx, id); err != nil {
			return err
		}
		if len(h) == 0 {
			// Known but without history, or unknown (ErrNotFound).
			if _, err := c.db.Machine(ctx, id, 1); err != nil {
				return err
			}
		}
	}
	names, err := c.db.ProviderIDs(ctx, []uuid.UUID{id})
	if err != nil {
		return err
	}
	if c.json {
		out := make([]historyJSON, 0, len(h))
		for _, e := range h {
			j := historyJSON{ID: e.ID, Machine: e.Machine, ProviderID: names[e.Machine], Process: e.Process, Event: e.Event, Timestamp: e.Timestamp, Cause: e.Cause,
				Actor: e.Actor.Name, ActorRole: e.Actor.Role}
			if e.Session != uuid.Nil {
				j.Session = &e.Session
			}
			out = append(out, j)
		}
		return c.emitJSON(out)
	}
	// Which machine, as its provider knows it, on stderr: stdout is the
	// table, which scripts read.
	fmt.Fprintf(c.errOut, "History of %s\n", machineName(operator.SelectedMachine{Machine: id, ProviderID: names[id]}))
	var rows [][]string
	for _, e := range h {
		var session string
		if e.Session != uuid.Nil {
			session = e.Session.String()
		}
		var actor string
		if e.Actor.Name != "" || e.Actor.Role != "" {
			actor = e.Actor.Name + " (role " + e.Actor.Role + ")"
		}
		rows = append(rows, []string{fmt.Sprint(e.ID), when(e.Timestamp), e.Process, string(e.Event), session, actor, e.Cause})
	}
	return c.table([]string{"ID", "TIME", "PROCESS", "EVENT", "SESSION", "ACTOR", "CAUSE"}, rows)
}

func (c *cli) backoffClear(ctx context.Context, args []string) error {
	if args[0] != "clear" {
		return usagef("backoff %q: the only backoff action is clear", args[0])
	}
	id, err := c.machine(ctx, args[1])
	if err != nil {
		return err
	}
	var process string
	if len(args) == 3 {
		p, err := c.process(args[2])
		if err != nil {
			return err
		}
		process = p.process.Name
	}
	cleared, err := c.db.ClearBackoff(ctx, id, process, c.opts.reason)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(cleared, func(b operator.ClearedBackoff) clearedJSON {
			return clearedJSON{id, b.Process, b.Until, b.Cause, int64(b.LastInterval / time.Second), b.WasActive}
		}))
	}
	for _, b := range cleared {
		state := "active until " + when(b.Until)
		if !b.WasActive {
			state = "already ended at " + when(b.Until)
		}
		fmt.Fprintf(c.out, "Cleared the backoff of %s on %s (%s, interval %s, cause: %s)\n", b.Process, id, state, b.LastInterval, untrusted.Line(b.Cause, 0))
	}
	return nil
}

func (c *cli) retry(ctx context.Context, args []string) error {
	id, p, err := c.machineAndProcess(ctx, args)
	if err != nil {
		return err
	}
	res, err := c.db.Retry(ctx, id, p.process.Name, c.opts.reason)
	if err != nil {
		return err
	}
	holds, err := c.holdsFor(ctx, id, p.process.Name)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(struct {
			Machine         uuid.UUID  `json:"machine"`
			Process         string     `json:"process"`
			BackoffEnded    bool       `json:"backoff_ended"`
			RescheduleEnded bool       `json:"reschedule_ended"`
			Leased          bool       `json:"leased"`
			Held            bool       `json:"held"`
			Holds           []holdJSON `json:"holds"`
		}{id, p.process.Name, res.BackoffEnded, res.RescheduleEnded, res.Leased, len(holds) > 0, jsonList(holds, toHoldJSON)})
	}
	switch {
	case len(holds) > 0:
		c.printHeldRetry(args[0], p, holds)
	case res.Leased:
		fmt.Fprintf(c.out, "%s is working on %s right now; the retry is recorded and matters if that work fails\n", p.process.Name, id)
	case res.BackoffEnded || res.RescheduleEnded:
		fmt.Fprintf(c.out, "Ended %s of %s on %s: it is eligible now, if %s's condition holds\n", retryEnded(res), p.process.Name, id, p.process.Name)
	default:
		fmt.Fprintf(c.out, "%s had no backoff on %s: it is eligible already, if %s's condition holds; the retry is recorded\n", p.process.Name, id, p.process.Name)
	}
	return nil
}

// holdsFor returns the active holds that keep process off machine: its
// own and those of every process.
func (c *cli) holdsFor(ctx context.Context, machine uuid.UUID, process string) ([]operator.Hold, error) {
	all, err := c.db.HoldsOf(ctx, machine)
	if err != nil {
		return nil, err
	}
	var out []operator.Hold
	for _, h := range all {
		if h.Process == process || h.Process == "" {
			out = append(out, h)
		}
	}
	return out, nil
}

// printHeldRetry tells an operator whose retry cannot take effect that
// the machine is held (escalated by its budget, or by an operator), and
// what ends the hold: a retry does not, and "eligible already" would send
// them waiting for a lease that never comes.
func (c *cli) printHeldRetry(machine string, p cliProcess, holds []operator.Hold) {
	fmt.Fprintf(c.out, "The retry is recorded, but %s will not act on %s: it is held\n", p.process.Name, machine)
	for _, h := range holds {
		what := "held by " + untrusted.Line(h.Actor.Name, 200)
		if h.Source == operator.HoldByBudget {
			what = "escalated (per-machine budget used up)"
		}
		fmt.Fprintf(c.out, "  - for %s: %s since %s: %s\n", forWhom(h.Process), what, when(h.HeldAt), untrusted.Line(h.Reason, 200))
	}
	release := fmt.Sprintf("shepherd release %s -process %s -reason R", machine, p.process.Name)
	if slices.ContainsFunc(holds, func(h operator.Hold) bool { return h.Process == "" }) {
		release = fmt.Sprintf("shepherd release %s -reason R", machine)
	}
	fmt.Fprintf(c.out, "A retry does not lift a hold: to let %s act on it again, run: %s\n", p.process.Name, renamed(c.prog, untrusted.Line(release, 0)))
}

// retryEnded names what a retry ended: a backoff, a check-again-later time
// (a rescheduled machine's), or both; telling an operator that a backoff
// ended when the machine was only waiting would send them after a failure
// that never happened.
func retryEnded(res operator.RetryResult) string {
	switch {
	case res.BackoffEnded && res.RescheduleEnded:
		return "the backoff and the check-again-later time"
	case res.RescheduleEnded:
		return "the check-again-later time (rescheduled)"
	default:
		return "the backoff"
	}
}

// clearedJSON is a cleared backoff in JSON.
type clearedJSON struct {
	Machine             uuid.UUID `json:"machine"`
	Process             string    `json:"process"`
	Until               time.Time `json:"until"`
	Cause               string    `json:"cause"`
	LastIntervalSeconds int64     `json:"last_interval_seconds"`
	WasActive           bool      `json:"was_active"`
}

// sessionJSON is a BMDB session in JSON.
type sessionJSON struct {
	ID              uuid.UUID `json:"id"`
	Component       string    `json:"component"`
	RuntimeInfo     string    `json:"runtime_info"`
	Created         time.Time `json:"created"`
	IntervalSeconds int64     `json:"interval_seconds"`
	Deadline        time.Time `json:"deadline"`
	Alive           bool      `json:"alive"`
}

// jsonList converts items for -json with toJSON; none is an empty list,
// never null, so that scripts can iterate over any answer.
func jsonList[T, J any](items []T, toJSON func(T) J) []J {
	out := make([]J, 0, len(items))
	for _, item := range items {
		out = append(out, toJSON(item))
	}
	return out
}

// pauseJSON is a pause in JSON.
type pauseJSON struct {
	Process   string     `json:"process"`
	Reason    string     `json:"reason"`
	Source    string     `json:"source"`
	PausedAt  time.Time  `json:"paused_at"`
	ResumedAt *time.Time `json:"resumed_at,omitempty"`
	Actor     string     `json:"actor,omitempty"`
	ActorRole string     `json:"actor_role,omitempty"`
}

func toPauseJSON(p operator.Pause) pauseJSON {
	j := pauseJSON{Process: p.Process, Reason: p.Reason, Source: p.Source, PausedAt: p.PausedAt, Actor: p.Actor.Name, ActorRole: p.Actor.Role}
	if !p.Active() {
		j.ResumedAt = &p.ResumedAt
	}
	return j
}

func (c *cli) pause(ctx context.Context, args []string) error {
	p, err := c.process(args[0])
	if err != nil {
		return err
	}
	ctx = bmdb.WithActor(ctx, c.actor())
	paused, err := c.db.PauseProcess(ctx, p.process.Name, c.opts.reason)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(toPauseJSON(paused))
	}
	c.printf("Paused %s: no replica leases machines for it from its next claim on; work in flight runs to its end. Undo with: shepherd resume %s -reason R\n", paused.Process, args[0])
	return nil
}

func (c *cli) resume(ctx context.Context, args []string) error {
	p, err := c.process(args[0])
	if err != nil {
		return err
	}
	ctx = bmdb.WithActor(ctx, c.actor())
	lifted, err := c.db.ResumeProcessBecause(ctx, p.process.Name, c.opts.reason)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(toPauseJSON(lifted))
	}
	by := lifted.Source
	if lifted.Actor.Name != "" {
		by = untrusted.Line(lifted.Actor.Name, 0)
	}
	fmt.Fprintf(c.out, "Resumed %s (paused by %s since %s: %s)\n", lifted.Process, by, when(lifted.PausedAt), untrusted.Line(lifted.Reason, 0))
	return nil
}

// pauseEventJSON is a pause or resume in JSON.
type pauseEventJSON struct {
	ID        int64      `json:"id"`
	Process   string     `json:"process"`
	Event     bmdb.Event `json:"event"`
	Timestamp time.Time  `json:"timestamp"`
	Reason    string     `json:"reason,omitempty"`
	Source    string     `json:"source"`
	Actor     string     `json:"actor,omitempty"`
	ActorRole string     `json:"actor_role"`
}

// pauses lists the pauses and resumes of processes, newest first.
func (c *cli) pauses(ctx context.Context, _ []string) error {
	process := ""
	if c.opts.process != "" {
		p, err := c.process(c.opts.process)
		if err != nil {
			return err
		}
		process = p.process.Name
	}
	events, err := c.db.PauseHistory(ctx, process, c.opts.limit)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(events, func(e operator.PauseEvent) pauseEventJSON {
			return pauseEventJSON{e.ID, e.Process, e.Event, e.Timestamp, e.Reason, e.Source, e.Actor.Name, e.Actor.Role}
		}))
	}
	var rows [][]string
	for _, e := range events {
		rows = append(rows, []string{fmt.Sprint(e.ID), when(e.Timestamp), e.Process, string(e.Event), e.Source, e.Actor.Name + " (role " + e.Actor.Role + ")", e.Reason})
	}
	return c.table([]string{"ID", "TIME", "PROCESS", "EVENT", "SOURCE", "ACTOR", "REASON"}, rows)
}

func (c *cli) sessions(ctx context.Context, _ []string) error {
	ss, err := c.db.Sessions(ctx)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(ss, func(s bmdb.SessionInfo) sessionJSON {
			return sessionJSON{s.ID, s.Component, s.RuntimeInfo, s.Created, int64(s.Interval / time.Second), s.Deadline, s.Alive}
		}))
	}
	var rows [][]string
	for _, s := range ss {
		state := "live"
		if !s.Alive {
			state = "expired"
		}
		rows = append(rows, []string{s.ID.String(), s.Component, state, when(s.Created), when(s.Deadline), s.Interval.String(), s.RuntimeInfo})
	}
	return c.table([]string{"SESSION", "COMPONENT", "STATE", "CREATED", "DEADLINE", "INTERVAL", "RUNTIME"}, rows)
}

// joinStates lists states for a message: "eligible, leased".
func joinStates(states []operator.State) string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}
