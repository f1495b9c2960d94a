package controlloop

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/metric"
)

// DefaultLimits are the limits before flags: none, a breaker threshold
// ready for when a window is set, and a generous expected duration.
func DefaultLimits() bmdb.Limits {
	return bmdb.Limits{BreakerThreshold: 0.5, ExpectedDuration: 15 * time.Minute}
}

// defaultLimits are DefaultLimits with the process's default per-machine
// budget.
func defaultLimits(info Info) bmdb.Limits {
	l := DefaultLimits()
	l.MachineBudget = info.DefaultMachineBudget
	return l
}

// ParseMachineBudget parses the -<p>_machine_budget form N/DURATION
// ("3/24h"); "0" and "none" are no budget.
func ParseMachineBudget(s string) (bmdb.MachineBudget, error) {
	s = strings.TrimSpace(s)
	if s == "0" || s == "none" {
		return bmdb.MachineBudget{}, nil
	}
	n, w, ok := strings.Cut(s, "/")
	if !ok {
		return bmdb.MachineBudget{}, fmt.Errorf("machine budget %q: want N/DURATION (e.g. 3/24h), or none", s)
	}
	count, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || count < 1 {
		return bmdb.MachineBudget{}, fmt.Errorf("machine budget %q: N must be a whole number of at least 1", s)
	}
	window, err := time.ParseDuration(strings.TrimSpace(w))
	if err != nil {
		return bmdb.MachineBudget{}, fmt.Errorf("machine budget %q: duration: %w", s, err)
	}
	if window < time.Second || window > maxBudgetWindow {
		return bmdb.MachineBudget{}, fmt.Errorf("machine budget %q: duration must be between 1s and %s", s, maxBudgetWindow)
	}
	return bmdb.MachineBudget{N: count, Window: window}, nil
}

// maxBudgetWindow bounds a budget's window: history older than the
// retention is gone anyway, and a longer window reads more of it.
const maxBudgetWindow = 90 * 24 * time.Hour

// budgetValue adapts a *bmdb.MachineBudget to flag.Value.
type budgetValue struct{ b *bmdb.MachineBudget }

func (v budgetValue) String() string {
	if v.b == nil {
		return ""
	}
	return v.b.String()
}

func (v budgetValue) Set(s string) error {
	b, err := ParseMachineBudget(s)
	if err != nil {
		return err
	}
	*v.b = b
	return nil
}

// registerLimitFlags registers the flags of l as <prefix>_<name>.
func registerLimitFlags(l *bmdb.Limits, fs *flag.FlagSet, prefix string) {
	p := prefix + "_"
	fs.IntVar(&l.MaxInFlight, p+"max_in_flight", l.MaxInFlight, "most machines "+prefix+" acts on at once, across all replicas (0 = no limit)")
	fs.IntVar(&l.MaxPerHour, p+"max_per_hour", l.MaxPerHour, "most machines "+prefix+" starts work on in any hour, across all replicas (0 = no limit)")
	fs.IntVar(&l.BreakerWindow, p+"breaker_window", l.BreakerWindow, "circuit breaker: number of recent "+prefix+" attempts judged, across all replicas (0 = no breaker)")
	fs.Var(floatFlag{f: &l.BreakerThreshold, want: "a ratio between 0 and 1, e.g. 0.5"}, p+"breaker_threshold", "circuit breaker: failure ratio of the window above which "+prefix+" pauses itself until 'shepherd resume' (0..1)")
	fs.Var(budgetValue{&l.MachineBudget}, p+"machine_budget", "per-machine budget N/DURATION: after N "+prefix+" leases of one machine within DURATION, the next claim holds the machine for "+prefix+" and records Escalated instead of acting, until 'shepherd release' (none = no budget)")
	fs.DurationVar(&l.ExpectedDuration, p+"expected_work_duration", l.ExpectedDuration, "how long one "+prefix+" action should take at most; a lease held longer raises the ShepherdWorkOverdue alert")
}

// checkLimits validates l; its errors name the flag.
func checkLimits(l *bmdb.Limits, prefix string) error {
	p := "-" + prefix + "_"
	switch {
	case l.MaxInFlight < 0:
		return fmt.Errorf("%smax_in_flight %d: must not be negative (0 = no limit)", p, l.MaxInFlight)
	case l.MaxPerHour < 0:
		return fmt.Errorf("%smax_per_hour %d: must not be negative (0 = no limit)", p, l.MaxPerHour)
	case l.BreakerWindow < 0:
		return fmt.Errorf("%sbreaker_window %d: must not be negative (0 = no breaker)", p, l.BreakerWindow)
	case math.IsNaN(l.BreakerThreshold) || l.BreakerThreshold < 0 || l.BreakerThreshold >= 1:
		return fmt.Errorf("%sbreaker_threshold %g: must be at least 0 and below 1 (a ratio of failures)", p, l.BreakerThreshold)
	case l.ExpectedDuration <= 0:
		return fmt.Errorf("%sexpected_work_duration %s: must be positive", p, l.ExpectedDuration)
	}
	return nil
}

// onEscalated is the runner's record of escalations, for its claims,
// which logs to logger (the claimer's: bmdb calls it after a claim's
// commit, with no context of its own).
func (r *Runner) onEscalated(logger klog.Logger) func(bmdb.Escalation) {
	return func(e bmdb.Escalation) { r.escalated(logger, e) }
}

// escalated counts and logs a machine a claim held because it used up the
// process's per-machine budget.
func (r *Runner) escalated(logger klog.Logger, e bmdb.Escalation) {
	r.metrics.limits.escalated.WithLabelValues(r.info.Label).Inc()
	logger.Error(nil, "Machine escalated: it used up the process's per-machine budget and is held for a human",
		"process", r.info.Label, "machine", e.Machine, "provider_id", e.ProviderID, "budget", e.Budget.String(),
		"see", r.program()+" history "+e.Machine.String(), "release_with", r.program()+" release "+e.Machine.String()+" -process "+r.info.Label+" -reason R")
}

// program is the program's name in the commands the runner's logs
// suggest (Config.Program).
func (r *Runner) program() string { return cmp.Or(r.cfg.Program, DefaultProgram) }

// limitMetrics are the runner's metrics about limits, labelled by process.
type limitMetrics struct {
	paused       *prometheus.GaugeVec
	oldestLease  *prometheus.GaugeVec
	expected     *prometheus.GaugeVec
	limit        *prometheus.GaugeVec
	breakerTrips *prometheus.CounterVec
	held         *prometheus.GaugeVec
	escalated    *prometheus.CounterVec
}

// pauseReasons are the values of shepherd_process_paused's reason label.
var pauseReasons = []string{bmdb.PauseByOperator, bmdb.PauseByBreaker}

func newLimitMetrics(reg prometheus.Registerer) *limitMetrics {
	return &limitMetrics{
		paused: metric.GaugeVec(reg, "shepherd_process_paused",
			"1 while the process is paused in the BMDB, by reason: operator (shepherd pause) or breaker (its circuit breaker tripped); refreshed periodically.", "process", "reason"),
		oldestLease: metric.GaugeVec(reg, "shepherd_work_oldest_lease_seconds",
			"Age of the process's oldest lease across all replicas (0 without leases), refreshed periodically.", "process"),
		expected: metric.GaugeVec(reg, "shepherd_work_expected_duration_seconds",
			"How long one piece of the process's work should take at most (-<process>_expected_work_duration).", "process"),
		limit: metric.GaugeVec(reg, "shepherd_work_limit",
			"The process's configured safety limits, by limit: max_in_flight (compare with shepherd_work_leases), max_per_hour, machine_budget and machine_budget_window_seconds (-<process>_machine_budget); 0 means no limit.", "process", "limit"),
		breakerTrips: metric.CounterVec(reg, "shepherd_breaker_trips_total",
			"Times this replica's check tripped the process's circuit breaker (and paused the process).", "process"),
		held: metric.GaugeVec(reg, "shepherd_machines_held",
			"Machines held for the process (its holds and holds of every process: shepherd hold, or its per-machine budget), which its claims pass over; refreshed periodically.", "process"),
		escalated: metric.CounterVec(reg, "shepherd_machines_escalated_total",
			"Machines this replica's claims held for a human because they used up the process's per-machine budget (-<process>_machine_budget), recorded Escalated.", "process"),
	}
}

func (m *limitMetrics) initProcess(label string, l bmdb.Limits) {
	for _, reason := range pauseReasons {
		m.paused.WithLabelValues(label, reason)
	}
	m.oldestLease.WithLabelValues(label)
	m.expected.WithLabelValues(label).Set(l.ExpectedDuration.Seconds())
	m.limit.WithLabelValues(label, "max_in_flight").Set(float64(l.MaxInFlight))
	m.limit.WithLabelValues(label, "max_per_hour").Set(float64(l.MaxPerHour))
	m.breakerTrips.WithLabelValues(label)
	m.held.WithLabelValues(label)
	m.escalated.WithLabelValues(label)
	m.limit.WithLabelValues(label, "machine_budget").Set(float64(l.MachineBudget.N))
	m.limit.WithLabelValues(label, "machine_budget_window_seconds").Set(l.MachineBudget.Window.Seconds())
}

// Candidates is the process's candidate condition, as the runner claims
// it (for the status page's eligible count).
func (r *Runner) Candidates() bmdb.Candidates { return r.candidates }

// Limits are the runner's safety limits.
func (r *Runner) Limits() bmdb.Limits { return r.cfg.Limits }

// checkBreaker runs after each failure this replica records: it judges the
// process's last attempts, across replicas, and pauses the process when the
// breaker trips. A failed check is logged and left to the next failure:
// the breaker is a safety net, not a reason to stop the work.
func (r *Runner) checkBreaker(ctx context.Context) {
	l := r.cfg.Limits
	if l.BreakerWindow <= 0 {
		return
	}
	label := r.info.Label
	logger := klog.FromContext(ctx)
	v, err := r.db.CheckBreaker(ctx, r.info.Process.Name, bmdb.BreakerOf(l))
	if err != nil {
		logger.Error(err, "Checking the circuit breaker failed", "process", label)
		return
	}
	if !v.Tripped {
		return
	}
	r.trippedAt.Store(time.Now().UnixNano())
	r.metrics.limits.breakerTrips.WithLabelValues(label).Inc()
	r.metrics.limits.paused.WithLabelValues(label, bmdb.PauseByBreaker).Set(1)
	r.metrics.limits.paused.WithLabelValues(label, bmdb.PauseByOperator).Set(0)
	logger.Error(nil, "Circuit breaker tripped: the process is paused on every replica until an operator resumes it",
		"process", label, "failed", v.Failed, "attempts", v.Attempts, "threshold", l.BreakerThreshold, "resume_with", r.program()+" resume "+label+" -reason R")
}

// showLimitStatus updates the pause and oldest-lease gauges and logs when
// this replica sees the process paused or resumed, to logger.
func (r *Runner) showLimitStatus(logger klog.Logger, st bmdb.LimitStatus) {
	label := r.info.Label
	for _, reason := range pauseReasons {
		v := 0.0
		if st.PausedBy == reason {
			v = 1
		}
		r.metrics.limits.paused.WithLabelValues(label, reason).Set(v)
	}
	r.metrics.limits.oldestLease.WithLabelValues(label).Set(st.OldestLease.Seconds())
	r.metrics.limits.held.WithLabelValues(label).Set(float64(st.Held))
	if seen := &r.limitState; !seen.refreshed || seen.pausedBy != st.PausedBy {
		switch {
		case st.PausedBy != "":
			logger.Info("Paused: no replica leases machines for the process until it is resumed", "process", label, "paused_by", st.PausedBy, "reason", st.PauseReason, "resume_with", r.program()+" resume "+label+" -reason R")
		case seen.refreshed:
			logger.Info("Resumed", "process", label)
		}
		seen.refreshed, seen.pausedBy = true, st.PausedBy
	}
}

// limitState is what the gauge refresher last saw, to log changes once. Only
// the refresher's goroutine touches it.
type limitState struct {
	refreshed bool
	pausedBy  string
}
