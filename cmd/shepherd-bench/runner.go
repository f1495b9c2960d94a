package main

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	authorbmdb "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// benchKey is the agent public key recorded by processes that mark their
// machines started.
var benchKey = []byte("shepherd-bench")

// noopProcess is a process that does nothing to its machine: what is
// measured is the framework around it (claiming, leases, finishing).
type noopProcess struct {
	info       controlloop.Info
	candidates bmdb.Candidates
	// onRun, if set, is told of every machine the process runs on.
	onRun func(machine uuid.UUID, at time.Time)
	// markStarted makes the process record machine_agent_started when it
	// finishes, as AgentStart does, so that a machine it ran on is no longer
	// a candidate of agentstart.Candidates.
	markStarted bool
}

// definition is the process's definition, which the runner reads.
func (p *noopProcess) definition() controlloop.Definition {
	return controlloop.Definition{
		Info:       p.info,
		Candidates: func() (bmdb.Candidates, error) { return p.candidates, nil },
		New:        func(controlloop.Env) (controlloop.Handler, error) { return p, nil },
	}
}

func (p *noopProcess) Run(ctx context.Context, t *controlloop.Task) error {
	if p.onRun != nil {
		p.onRun(t.Machine, time.Now())
	}
	if p.markStarted {
		m := t.Machine
		t.Commit = func(ctx context.Context, tx authorbmdb.Tx) error {
			return tx.SetAgentStarted(ctx, m, benchKey)
		}
	}
	return nil
}

// procSpec describes one process of a benchmark run.
type procSpec struct {
	name        string // BMDB process name
	label       string
	candidates  bmdb.Candidates
	workers     int
	unlimited   bool // query rate unlimited instead of the default
	onRun       func(uuid.UUID, time.Time)
	markStarted bool
}

func newProcess(sp procSpec) *noopProcess {
	return &noopProcess{
		info: controlloop.Info{
			Process:        bmdb.Process{Name: sp.name},
			Label:          sp.label,
			DefaultBackoff: bmdb.Backoff{Initial: time.Second, Maximum: time.Minute, Exponent: 2},
		},
		candidates:  sp.candidates,
		onRun:       sp.onRun,
		markStarted: sp.markStarted,
	}
}

// configFor is the runner configuration of a spec: the daemon's defaults,
// with the spec's parallelism and, if asked, no query rate limit.
func configFor(p *noopProcess, sp procSpec) controlloop.Config {
	cfg := controlloop.DefaultConfig(p.info)
	cfg.Parallelism = sp.workers
	if sp.unlimited {
		cfg.QueryRate = controlloop.Rate{Interval: 0, Burst: 1}
	}
	return cfg
}

// runners are controlloop.Runners running in the background.
type runners struct {
	reg    *prometheus.Registry
	cancel context.CancelFunc
	g      errgroup.Group
}

// startRunners starts one runner per spec on db, sharing one metrics
// registry, as the daemon does.
func startRunners(ctx context.Context, db *bmdb.DB, specs []procSpec) (*runners, error) {
	rs := &runners{reg: prometheus.NewRegistry()}
	m := controlloop.NewMetrics(rs.reg)
	var list []*controlloop.Runner
	for _, sp := range specs {
		p := newProcess(sp)
		r, err := controlloop.NewRunner(db.Public(), p.definition(), p, configFor(p, sp), m)
		if err != nil {
			return nil, err
		}
		list = append(list, r)
	}
	ctx, rs.cancel = context.WithCancel(ctx)
	for _, r := range list {
		rs.g.Go(func() error { return r.Run(ctx) })
	}
	return rs, nil
}

// stop shuts the runners down as SIGTERM would and waits for them.
func (rs *runners) stop() error {
	rs.cancel()
	return rs.g.Wait()
}

// finished counts the work the runners finished successfully: completed
// claim + finish cycles.
func (rs *runners) finished() int64 {
	byResult, err := counterBy(rs.reg, "shepherd_work_finished_total", "result")
	if err != nil {
		return 0
	}
	return int64(byResult[string(controlloop.ResultFinished)])
}

// counterBy sums the counter family name of reg by the value of its label.
func counterBy(reg *prometheus.Registry, name, label string) (map[string]float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// waitFinished waits until the runners finished at least n cycles, or d
// has passed.
func (rs *runners) waitFinished(ctx context.Context, n int64, d time.Duration) {
	deadline := time.Now().Add(d)
	for rs.finished() < n && time.Now().Before(deadline) {
		if !sleep.For(ctx, 20*time.Millisecond) {
			return
		}
	}
}

func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, dsn)
}
