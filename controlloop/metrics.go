package controlloop

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Results of work, the values of the result label.
const (
	ResultFinished = "finished"
	ResultFailed   = "failed"
	ResultCanceled = "canceled"
	// ResultLost: the lease was gone when the worker tried to end it (its
	// session expired and the reaper released it).
	ResultLost = "lost"
	// ResultRescheduled: finished with a time before which the machine is
	// not a candidate again (Task.CheckAgainAfter); not a failure.
	ResultRescheduled = "rescheduled"
)

var results = []string{ResultFinished, ResultRescheduled, ResultFailed, ResultCanceled, ResultLost}

// Metrics are the runner's Prometheus metrics, shared by all processes of a
// daemon and labelled by process. Names follow controller-runtime's
// conventions (counters _total, durations _seconds).
type Metrics struct {
	started       *prometheus.CounterVec
	finished      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	eligible      *prometheus.GaugeVec
	backoffs      *prometheus.GaugeVec
	leases        *prometheus.GaugeVec
	workersActive *prometheus.GaugeVec
	workersMax    *prometheus.GaugeVec
	sessionHeld   *prometheus.GaugeVec
	claims        *prometheus.CounterVec
	claimErrors   *prometheus.CounterVec
	panics        *prometheus.CounterVec
	endRetries    *prometheus.CounterVec
	oldestDue     *prometheus.GaugeVec
	listening     *prometheus.GaugeVec
	wakeups       *prometheus.CounterVec
	drift         *prometheus.CounterVec
	limits        *limitMetrics
}

// NewMetrics creates the runner metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shepherd_work_started_total",
			Help: "Work leases taken by this replica.",
		}, []string{"process"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shepherd_work_finished_total",
			Help: "Work ended by this replica, by result: finished, failed (backed off), canceled, lost (lease gone with its session).",
		}, []string{"process", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shepherd_work_duration_seconds",
			Help:    "Time from lease to end of work, by result.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"process", "result"}),
		eligible: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shepherd_machines_eligible",
			Help: "Machines the process could lease now (the work queue depth), refreshed periodically.",
		}, []string{"process"}),
		backoffs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shepherd_backoffs_active",
			Help: "Machines the process is backing off from now, refreshed periodically.",
		}, []string{"process"}),
		leases: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shepherd_work_leases",
			Help: "Leases the process holds now across all replicas, refreshed periodically.",
		}, []string{"process"}),
		workersActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shepherd_workers_active",
			Help: "Workers of this replica acting on a machine now.",
		}, []string{"process"}),
		workersMax: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shepherd_workers_max",
			Help: "Configured workers of this replica (loop parallelism).",
		}, []string{"process"}),
		sessionHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shepherd_loop_session_held",
			Help: "1 while the process's loop in this replica holds a live BMDB session.",
		}, []string{"process"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shepherd_claim_queries_total",
			Help: "Claiming (claim) queries, by outcome: leased (at least one machine), empty.",
		}, []string{"process", "outcome"}),
		claimErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shepherd_claim_errors_total",
			Help: "Claiming failures (database unreachable, session lost, ...).",
		}, []string{"process"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shepherd_work_panics_total",
			Help: "Panics in process code, each turned into a failure of its work.",
		}, []string{"process"}),
	}
	m.endRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shepherd_work_end_retries_total",
		Help: "Attempts to record the end of a lease (fail, cancel) that the BMDB refused and that were retried, by outcome: retried, abandoned (the session was given up so that the reaper records the lease as lost).",
	}, []string{"process", "outcome"})
	m.oldestDue = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shepherd_work_oldest_due_seconds",
		Help: "How long the longest-waiting machine the process could lease now has been due (0 when none), refreshed periodically: the backlog's age.",
	}, []string{"process"})
	m.listening = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shepherd_claim_notifications_listening",
		Help: "1 while the process's idle claimer is woken by database notifications (LISTEN); 0 while it polls every idle_poll (through a transaction pooler, or notifications lost).",
	}, []string{"process"})
	m.wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shepherd_claim_wakeups_total",
		Help: "Wake-ups of the idle claimer, by reason: notify (a machine became due), lease_ended (one of this replica's workers ended a lease, which makes its machine due again), timer (its next due time, the safety poll, or idle_poll while polling).",
	}, []string{"process", "reason"})
	m.drift = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shepherd_due_drift_total",
		Help: "Machines the reconcile pass found a claim would lease but that had no due row (a write the due triggers did not see); each was made due.",
	}, []string{"process"})
	reg.MustRegister(m.started, m.finished, m.duration, m.eligible, m.backoffs, m.leases,
		m.workersActive, m.workersMax, m.sessionHeld, m.claims, m.claimErrors, m.panics, m.endRetries,
		m.oldestDue, m.listening, m.wakeups, m.drift)
	m.limits = newLimitMetrics(reg)
	return m
}

// initProcess makes every series of a process exist at zero.
func (m *Metrics) initProcess(label string, parallelism int) {
	m.started.WithLabelValues(label)
	for _, r := range results {
		m.finished.WithLabelValues(label, r)
		m.duration.WithLabelValues(label, r)
	}
	m.eligible.WithLabelValues(label)
	m.oldestDue.WithLabelValues(label)
	m.listening.WithLabelValues(label)
	m.wakeups.WithLabelValues(label, "notify")
	m.wakeups.WithLabelValues(label, "timer")
	m.wakeups.WithLabelValues(label, "lease_ended")
	m.drift.WithLabelValues(label)
	m.backoffs.WithLabelValues(label)
	m.leases.WithLabelValues(label)
	m.workersActive.WithLabelValues(label)
	m.workersMax.WithLabelValues(label).Set(float64(parallelism))
	m.sessionHeld.WithLabelValues(label)
	m.claims.WithLabelValues(label, "leased")
	m.claims.WithLabelValues(label, "empty")
	m.claimErrors.WithLabelValues(label)
	m.panics.WithLabelValues(label)
	m.endRetries.WithLabelValues(label, "retried")
	m.endRetries.WithLabelValues(label, "abandoned")
}
