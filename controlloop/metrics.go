package controlloop

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/metric"
)

// Result is how the runner ended a lease: the value of the result label of
// shepherd_work_finished_total and shepherd_work_duration_seconds, which
// dashboards and alerts select by, so its values never change.
type Result string

// Results of leases.
const (
	ResultFinished Result = "finished"
	ResultFailed   Result = "failed"
	ResultCanceled Result = "canceled"
	// ResultLost: the lease was gone when the worker tried to end it (its
	// session expired and the reaper released it).
	ResultLost Result = "lost"
	// ResultRescheduled: finished with a time before which the machine is
	// not a candidate again (Task.CheckAgainAfter); not a failure.
	ResultRescheduled Result = "rescheduled"
	// ResultTimeout: Run did not return within -<p>_run_timeout; the lease
	// failed (backed off) with the cause "run timed out after D".
	ResultTimeout Result = "timeout"
)

var results = []Result{ResultFinished, ResultRescheduled, ResultFailed, ResultTimeout, ResultCanceled, ResultLost}

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
	queued        *prometheus.GaugeVec
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
	abandoned     *prometheus.GaugeVec
	limits        *limitMetrics
}

// NewMetrics creates the runner metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		started: metric.CounterVec(reg, "shepherd_work_started_total",
			"Work leases taken by this replica.", "process"),
		finished: metric.CounterVec(reg, "shepherd_work_finished_total",
			"Work ended by this replica, by result: finished, rescheduled, failed (backed off), timeout (failed: Run exceeded -<p>_run_timeout), canceled, lost (lease gone with its session).", "process", "result"),
		duration: metric.HistogramVec(reg, "shepherd_work_duration_seconds",
			"Time from lease to end of work, by result.",
			[]float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}, "process", "result"),
		eligible: metric.GaugeVec(reg, "shepherd_machines_eligible",
			"Machines the process could lease now (the work queue depth), refreshed periodically.", "process"),
		backoffs: metric.GaugeVec(reg, "shepherd_backoffs_active",
			"Machines the process is backing off from now, refreshed periodically.", "process"),
		leases: metric.GaugeVec(reg, "shepherd_work_leases",
			"Leases the process holds now across all replicas, refreshed periodically.", "process"),
		workersActive: metric.GaugeVec(reg, "shepherd_workers_active",
			"Workers of this replica acting on a machine now.", "process"),
		queued: metric.GaugeVec(reg, "shepherd_work_queued",
			"Machines this replica has leased ahead of its workers and not started yet (claimed ahead while runs are shorter than claims).", "process"),
		workersMax: metric.GaugeVec(reg, "shepherd_workers_max",
			"Configured workers of this replica (loop parallelism).", "process"),
		sessionHeld: metric.GaugeVec(reg, "shepherd_loop_session_held",
			"1 while the process's loop in this replica holds a live BMDB session.", "process"),
		claims: metric.CounterVec(reg, "shepherd_claim_queries_total",
			"Claiming (claim) queries, by outcome: leased (at least one machine), empty.", "process", "outcome"),
		claimErrors: metric.CounterVec(reg, "shepherd_claim_errors_total",
			"Claiming failures (database unreachable, session lost, ...).", "process"),
		panics: metric.CounterVec(reg, "shepherd_work_panics_total",
			"Panics in process code, each turned into a failure of its work.", "process"),
		endRetries: metric.CounterVec(reg, "shepherd_work_end_retries_total",
			"Attempts to record the end of a lease (fail, cancel) that the BMDB refused and that were retried, by outcome: retried, abandoned (the session was given up so that the reaper records the lease as lost).", "process", "outcome"),
		oldestDue: metric.GaugeVec(reg, "shepherd_work_oldest_due_seconds",
			"How long the longest-waiting machine the process could lease now has been due (0 when none), refreshed periodically: the backlog's age.", "process"),
		listening: metric.GaugeVec(reg, "shepherd_claim_notifications_listening",
			"1 while the process's idle claimer is woken by database notifications (LISTEN); 0 while it polls every idle_poll (through a transaction pooler, or notifications lost).", "process"),
		wakeups: metric.CounterVec(reg, "shepherd_claim_wakeups_total",
			"Wake-ups of the idle claimer, by reason: notify (a machine became due), lease_ended (one of this replica's workers ended a lease, which makes its machine due again), timer (its next due time, the safety poll, or idle_poll while polling).", "process", "reason"),
		drift: metric.CounterVec(reg, "shepherd_due_drift_total",
			"Machines the reconcile pass found a claim would lease but that had no due row (a write the due triggers did not see); each was made due.", "process"),
	}
	m.abandoned = metric.GaugeVec(reg, "shepherd_work_abandoned_runs",
		"Runs that ignored their context past -<p>_run_timeout and its grace: their lease was failed and their worker went on, while they still run (a provider that does not honour its context).", "process")
	m.limits = newLimitMetrics(reg)
	return m
}

// leaseSeries are the series of one process that every lease updates,
// looked up once: a lookup by label values hashes them under the
// vector's lock, several times a cycle.
type leaseSeries struct {
	started       prometheus.Counter
	workersActive prometheus.Gauge
	queued        prometheus.Gauge
	finished      map[Result]prometheus.Counter
	duration      map[Result]prometheus.Observer
}

// initProcess makes every series of a process exist at zero, and returns
// those its leases update.
func (m *Metrics) initProcess(label string, parallelism int) leaseSeries {
	ls := leaseSeries{
		started:       m.started.WithLabelValues(label),
		workersActive: m.workersActive.WithLabelValues(label),
		queued:        m.queued.WithLabelValues(label),
		finished:      map[Result]prometheus.Counter{},
		duration:      map[Result]prometheus.Observer{},
	}
	for _, r := range results {
		ls.finished[r] = m.finished.WithLabelValues(label, string(r))
		ls.duration[r] = m.duration.WithLabelValues(label, string(r))
	}
	m.eligible.WithLabelValues(label)
	m.oldestDue.WithLabelValues(label)
	m.listening.WithLabelValues(label)
	m.wakeups.WithLabelValues(label, "notify")
	m.wakeups.WithLabelValues(label, "timer")
	m.wakeups.WithLabelValues(label, "lease_ended")
	m.drift.WithLabelValues(label)
	m.abandoned.WithLabelValues(label)
	m.backoffs.WithLabelValues(label)
	m.leases.WithLabelValues(label)
	m.workersMax.WithLabelValues(label).Set(float64(parallelism))
	m.sessionHeld.WithLabelValues(label)
	m.claims.WithLabelValues(label, "leased")
	m.claims.WithLabelValues(label, "empty")
	m.claimErrors.WithLabelValues(label)
	m.panics.WithLabelValues(label)
	m.endRetries.WithLabelValues(label, "retried")
	m.endRetries.WithLabelValues(label, "abandoned")
	return ls
}
