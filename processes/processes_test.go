package processes_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

func TestMain(m *testing.M) { bmdbtest.Main(m) }

// The shipped processes' definitions state their identity once: the
// runner, the flags, the metrics and the CLI all read it there.
func TestDefinitions(t *testing.T) {
	a := agentstart.Definition()
	r := recovery.Definition()
	for _, d := range []controlloop.Definition{a, r} {
		if err := d.Validate(); err != nil {
			t.Error(err)
		}
	}
	if a.Info.Process.Name != "ShepherdAgentStart" || a.Info.Label != "agentstart" ||
		a.Info.DefaultBackoff != (bmdb.Backoff{Initial: 5 * time.Minute, Maximum: 4 * time.Hour, Exponent: 1.2}) {
		t.Errorf("AgentStart: %+v", a.Info)
	}
	if r.Info.Process.Name != "ShepherdRecovery" || r.Info.Label != "recovery" ||
		r.Info.DefaultBackoff != (bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 1.2}) {
		t.Errorf("Recovery: %+v", r.Info)
	}
	if a.Info.Process.ExclusionGroup == "" || a.Info.Process.ExclusionGroup != r.Info.Process.ExclusionGroup {
		t.Errorf("AgentStart (%q) and Recovery (%q) do not exclude each other", a.Info.Process.ExclusionGroup, r.Info.Process.ExclusionGroup)
	}
	if a.Info.Process != agentstart.Process || r.Info.Process != recovery.Process {
		t.Errorf("the definitions do not use the exported Process values")
	}
	if a.Info.Label != agentstart.Label || r.Info.Label != recovery.Label {
		t.Errorf("the definitions do not use the exported labels")
	}
	// Nothing is built without its provider: the CLI reads the
	// definition instead.
	for _, d := range []controlloop.Definition{a, r} {
		if h, err := d.New(controlloop.Env{}); err == nil || h != nil {
			t.Errorf("%s: New without a provider: %v, %v; want an error", d.Info.Label, h, err)
		}
	}
}

// Recovery's condition is its flags': read after they are parsed, as the
// daemon and the CLI do, never from a process built to read it.
func TestRecoveryCandidatesFollowFlags(t *testing.T) {
	def := recovery.Definition()
	if got, want := condition(t, def), recovery.Candidates(recovery.DefaultStartTimeout, recovery.DefaultHeartbeatTimeout); !reflect.DeepEqual(got, want) {
		t.Errorf("default condition %+v, want %+v", got, want)
	}
	def = configured(t, recovery.Definition(), "-recovery_start_timeout=1m", "-recovery_heartbeat_timeout=20s")
	if got, want := condition(t, def), recovery.Candidates(time.Minute, 20*time.Second); !reflect.DeepEqual(got, want) {
		t.Errorf("condition after the flags %+v, want %+v", got, want)
	}
	// Two definitions do not share their flags' values.
	if got, want := condition(t, recovery.Definition()), recovery.Candidates(recovery.DefaultStartTimeout, recovery.DefaultHeartbeatTimeout); !reflect.DeepEqual(got, want) {
		t.Errorf("a new definition's condition %+v, want the default %+v", got, want)
	}
	bad := recovery.Definition()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	bad.Flags(fs)
	if err := fs.Parse([]string{"-recovery_heartbeat_timeout=0s"}); err != nil {
		t.Fatal(err)
	}
	if err := bad.Check(); err == nil || !strings.Contains(err.Error(), "-recovery_heartbeat_timeout") {
		t.Errorf("Check of a zero heartbeat timeout: %v", err)
	}
}

// condition is def's condition, as the runner reads it.
func condition(t *testing.T, def controlloop.Definition) bmdb.Candidates {
	t.Helper()
	c, err := def.Candidates()
	if err != nil {
		t.Fatalf("%s: Candidates: %v", def.Info.Label, err)
	}
	return c
}

// configured returns def with its flags parsed from args and checked, as a
// binary does before it runs the process.
func configured(t *testing.T, def controlloop.Definition, args ...string) controlloop.Definition {
	t.Helper()
	fs := flag.NewFlagSet(def.Info.Label, flag.ContinueOnError)
	if def.Flags != nil {
		def.Flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s: %v", def.Info.Label, err)
	}
	if def.Check != nil {
		if err := def.Check(); err != nil {
			t.Fatalf("%s: %v", def.Info.Label, err)
		}
	}
	return def
}

// recoveryWith is Recovery's definition with cfg's timeouts as its flags.
func recoveryWith(t *testing.T, cfg recovery.Config) controlloop.Definition {
	t.Helper()
	args := []string{"-recovery_start_timeout=" + cfg.StartTimeout.String(), "-recovery_heartbeat_timeout=" + cfg.HeartbeatTimeout.String()}
	if cfg.VerifyTimeout != 0 {
		args = append(args, "-recovery_verify_timeout="+cfg.VerifyTimeout.String())
	}
	return configured(t, recovery.Definition(), args...)
}

func TestRecoveryConfig(t *testing.T) {
	var cfg recovery.Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	for name, want := range map[string]string{"recovery_start_timeout": "30m0s", "recovery_heartbeat_timeout": "10m0s"} {
		if f := fs.Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("-%s: %+v, want default %s", name, f, want)
		}
	}
	if err := fs.Parse([]string{"-recovery_start_timeout=1m", "-recovery_heartbeat_timeout=20s"}); err != nil {
		t.Fatal(err)
	}
	if cfg != (recovery.Config{StartTimeout: time.Minute, HeartbeatTimeout: 20 * time.Second, VerifyTimeout: recovery.DefaultVerifyTimeout}) {
		t.Errorf("parsed %+v", cfg)
	}
	if err := cfg.Check(); err != nil {
		t.Error(err)
	}
	cfg.HeartbeatTimeout = 0
	if err := cfg.Check(); err == nil || !strings.Contains(err.Error(), "-recovery_heartbeat_timeout") {
		t.Errorf("Check of a zero heartbeat timeout: %v", err)
	}
}

type env struct {
	t       *testing.T
	db      *bmdb.DB
	metrics *controlloop.Metrics
}

func newEnv(t *testing.T) *env {
	t.Helper()
	reg := prometheus.NewRegistry()
	db := bmdbtest.NewDB(t, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	return &env{t: t, db: db, metrics: controlloop.NewMetrics(reg)}
}

// run runs the process def, acting through provider, through a runner
// with fast test settings and backoff b until the test ends.
func (e *env) run(def controlloop.Definition, provider providers.Provider, b bmdb.Backoff) {
	e.t.Helper()
	cfg := controlloop.DefaultConfig(def.Info)
	cfg.Parallelism = 4
	cfg.QueryRate = controlloop.Rate{Interval: 0, Burst: 1}
	cfg.IdlePoll = 50 * time.Millisecond
	cfg.Backoff = b
	h, err := def.New(controlloop.Env{Provider: provider, DB: e.db.Public()})
	if err != nil {
		e.t.Fatalf("%s: New: %v", def.Info.Label, err)
	}
	r, err := controlloop.NewRunner(e.db.Public(), def, h, cfg, e.metrics)
	if err != nil {
		e.t.Fatalf("controlloop.NewRunner: %v", err)
	}
	bmdbtest.Background(e.t, "runner", r.Run)
}

func (e *env) history() []bmdb.HistoryEntry {
	e.t.Helper()
	return bmdbtest.History(e.t, e.db)
}

// count counts events per machine of process.
func count(h []bmdb.HistoryEntry, process bmdb.Process, event bmdb.Event) map[uuid.UUID]int {
	n := map[uuid.UUID]int{}
	for _, e := range h {
		if e.Process == process.Name && e.Event == event {
			n[e.Machine]++
		}
	}
	return n
}

// checkExclusive audits h with the shared auditor (bmdbtest): no two
// leases of the Shepherd exclusion group (AgentStart and Recovery) on one
// machine overlapped, and no end ended another's lease.
func checkExclusive(t *testing.T, h []bmdb.HistoryEntry) {
	t.Helper()
	bmdbtest.CheckExclusion(t, h, bmdbtest.GroupsOf(agentstart.Process, recovery.Process))
}

// agentState reads whether each machine (by provider id, as
// bmdbtest.ProvidedBy lists them) has an agent started and a
// heartbeat.
func (e *env) agentState(machines map[string]bmdb.Provided) (started, beating int) {
	e.t.Helper()
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		started, beating = 0, 0
		for _, m := range machines {
			if _, _, err := tx.AgentStarted(ctx, m.Machine); err == nil {
				started++
			} else if !errors.Is(err, bmdb.ErrNotFound) {
				return err
			}
			if _, err := tx.LastHeartbeat(ctx, m.Machine); err == nil {
				beating++
			} else if !errors.Is(err, bmdb.ErrNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return started, beating
}

// The shipped loops against the simulated fleet: AgentStart starts every
// agent (retrying failures after a backoff); when heartbeats stop, Recovery
// reboots the machines and deletes their tags, and AgentStart takes them
// again.
func TestAgentStartAndRecoveryWithSim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	fleet := sim.New(e.db.Public(), sim.Config{
		Machines:              20,
		AgentStartFailureRate: 0.25,
		ActionTime:            10 * time.Millisecond,
		HeartbeatInterval:     100 * time.Millisecond,
	})
	if err := fleet.Seed(ctx); err != nil {
		t.Fatal(err)
	}
	machines := bmdbtest.ProvidedBy(t, e.db, sim.Name)

	// Constant backoffs: a machine that fails a few times in a row must not
	// make the test wait for a long one.
	fast := bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1}
	stopAgents := bmdbtest.Background(e.t, "agent fleet", fleet.Run)
	e.run(agentstart.Definition(), fleet, fast)
	e.run(recoveryWith(t, recovery.Config{StartTimeout: 2 * time.Second, HeartbeatTimeout: 1500 * time.Millisecond}), fleet, fast)

	t0 := time.Now()
	bmdbtest.WaitUntil(t, 30*time.Second, "every agent started and heartbeating", func() bool {
		started, beating := e.agentState(machines)
		return started == len(machines) && beating == len(machines)
	})
	t.Logf("phase 1: %s", time.Since(t0))
	h := e.history()
	// Heartbeats arrive 15 times per heartbeat timeout.
	if n := len(count(h, recovery.Process, bmdb.EventStarted)); n != 0 {
		t.Errorf("Recovery acted on %d machines whose agents heartbeat", n)
	}

	// Every agent stops heartbeating.
	stopAgents()
	t0 = time.Now()
	bmdbtest.WaitUntil(t, 30*time.Second, "Recovery to reboot every machine", func() bool {
		return len(count(e.history(), recovery.Process, bmdb.EventFinished)) == len(machines)
	})

	// Agents run again: AgentStart takes the machines again, and they stay
	// up.
	t.Logf("phase 2: %s", time.Since(t0))
	t0 = time.Now()
	bmdbtest.Background(e.t, "agent fleet", fleet.Run)
	bmdbtest.WaitUntil(t, 30*time.Second, "every agent restarted and heartbeating", func() bool {
		started, beating := e.agentState(machines)
		return started == len(machines) && beating == len(machines)
	})

	t.Logf("phase 3: %s", time.Since(t0))
	h = e.history()
	checkExclusive(t, h)
	failed := 0
	for _, e := range h {
		if e.Process == agentstart.Process.Name && e.Event == bmdb.EventFailed {
			failed++
			if !strings.Contains(e.Cause, "sim: agent start failed") {
				t.Errorf("AgentStart failure cause %q", e.Cause)
			}
		}
	}
	if failed == 0 {
		t.Errorf("no AgentStart failure with a failure rate of 0.25")
	}
	starts := count(h, agentstart.Process, bmdb.EventFinished)
	reboots := count(h, recovery.Process, bmdb.EventFinished)
	for _, m := range machines {
		if starts[m.Machine] < 2 || reboots[m.Machine] < 1 {
			t.Errorf("%s: %d agent starts and %d reboots, want at least 2 and 1", m.ProviderID, starts[m.Machine], reboots[m.Machine])
		}
	}
}

// fakeProvider fails every action; on some machines with a custom backoff,
// with a custom backoff, as a provider does for a changed SSH host key.
type fakeProvider struct {
	hostKeyChanged map[string]bool
	backoff        bmdb.Backoff
}

func (*fakeProvider) Name() string { return "fake" }

func (p *fakeProvider) StartAgent(ctx context.Context, m bmdb.Provided) ([]byte, error) {
	return nil, p.fail(m)
}

func (p *fakeProvider) Reboot(ctx context.Context, m bmdb.Provided) error { return p.fail(m) }

func (p *fakeProvider) fail(m bmdb.Provided) error {
	if p.hostKeyChanged[m.ProviderID] {
		return backoff.With(errors.New("ssh: host key changed"), p.backoff)
	}
	return errors.New("ssh: connection refused")
}

// A provider's failure mode with its own backoff gets that backoff
// persisted, by either process; the other failures get the default.
func TestProviderCustomBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	provider := &fakeProvider{hostKeyChanged: map[string]bool{}, backoff: bmdb.Backoff{Initial: 12 * time.Hour, Maximum: 48 * time.Hour, Exponent: 2}}
	var machines []uuid.UUID
	err := e.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		machines = machines[:0]
		for i := range 6 {
			id := fmt.Sprintf("fake-%d", i)
			provider.hostKeyChanged[id] = i%2 == 0
			m, err := tx.AddMachine(ctx, bmdb.Provided{Provider: "fake", ProviderID: id})
			if err != nil {
				return err
			}
			machines = append(machines, m)
		}
		// The last two have a dead agent, for Recovery.
		for _, m := range machines[4:] {
			if err := tx.SetAgentStarted(ctx, m, []byte("dead")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	as := agentstart.Definition()
	rec := recoveryWith(t, recovery.Config{StartTimeout: time.Millisecond, HeartbeatTimeout: time.Millisecond})
	e.run(as, provider, as.Info.DefaultBackoff)
	e.run(rec, provider, rec.Info.DefaultBackoff)

	bmdbtest.WaitUntil(t, 20*time.Second, "every machine to fail", func() bool {
		h := e.history()
		return len(count(h, agentstart.Process, bmdb.EventFailed)) == 4 && len(count(h, recovery.Process, bmdb.EventFailed)) == 2
	})
	for i, m := range machines {
		process := agentstart.Process
		want := int64(5 * 60)
		if i >= 4 {
			process, want = recovery.Process, 60
		}
		if i%2 == 0 {
			want = 12 * 3600
		}
		b, err := e.db.BackoffOf(ctx, m, process)
		if err != nil {
			t.Fatal(err)
		}
		if b == nil || int64(b.LastInterval/time.Second) != want {
			t.Errorf("machine %d: %s backoff %+v, want %ds", i, process.Name, b, want)
		}
	}
}

// Two replicas, each with its own simulated agents and loops, share one
// fleet: every machine gets exactly one live agent, the leases of the two
// never overlap, and both replicas do part of the work.
func TestTwoReplicasShareTheFleet(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	ctx := context.Background()
	fast := bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1}
	var replicas []*env
	var fleets []*sim.Provider
	cfg := sim.Config{Machines: 30, AgentStartFailureRate: 0.2, ActionTime: 20 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}
	for range 2 {
		reg := prometheus.NewRegistry()
		db := bmdbtest.OpenWith(t, dsn, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
		e := &env{t: t, db: db, metrics: controlloop.NewMetrics(reg)}
		fleet := sim.New(db.Public(), cfg)
		if err := fleet.Seed(ctx); err != nil {
			t.Fatal(err)
		}
		bmdbtest.Background(e.t, "agent fleet", fleet.Run)
		e.run(agentstart.Definition(), fleet, fast)
		e.run(recoveryWith(t, recovery.Config{StartTimeout: 2 * time.Second, HeartbeatTimeout: 1500 * time.Millisecond}), fleet, fast)
		replicas = append(replicas, e)
		fleets = append(fleets, fleet)
	}
	e := replicas[0]
	machines := bmdbtest.ProvidedBy(t, e.db, sim.Name)
	if len(machines) != cfg.Machines {
		t.Fatalf("%d machines after both replicas seeded, want %d", len(machines), cfg.Machines)
	}

	bmdbtest.WaitUntil(t, 30*time.Second, "every agent started and heartbeating", func() bool {
		started, beating := e.agentState(machines)
		return started == len(machines) && beating == len(machines)
	})
	// Each machine's agent runs in the replica that started it.
	bmdbtest.WaitUntil(t, 10*time.Second, "each replica to run only the agents it started", func() bool {
		return fleets[0].Running()+fleets[1].Running() == len(machines)
	})
	h := e.history()
	checkExclusive(t, h)
	sessions := map[uuid.UUID]bool{}
	for _, e := range h {
		if e.Process == agentstart.Process.Name && e.Event == bmdb.EventFinished {
			sessions[e.Session] = true
		}
	}
	if fleets[0].Running() == 0 || fleets[1].Running() == 0 || len(sessions) < 2 {
		t.Errorf("one replica did all the work: agents %d and %d, from %d sessions", fleets[0].Running(), fleets[1].Running(), len(sessions))
	}
	if n := len(count(h, recovery.Process, bmdb.EventStarted)); n != 0 {
		t.Errorf("Recovery acted on %d machines whose agents heartbeat", n)
	}
}
