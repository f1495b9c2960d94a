package bmdb

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/metric"
)

// Metrics counts what the BMDB layer does, for the daemon's /metrics. A nil
// *Metrics is valid and counts nothing, so library users and tests need not
// care.
type Metrics struct {
	transactions    *prometheus.CounterVec
	sessionsStarted *prometheus.CounterVec
	sessionsExpired *prometheus.CounterVec
	sessionsReaped  prometheus.Counter
	leasesReaped    prometheus.Counter
	historyPruned   prometheus.Counter
	endsPerCommit   prometheus.Histogram
	prepared        prometheus.Gauge
	ha              *haMetrics
	// recovery: verified reboots (recovery.go).
	recovery *recoveryMetrics
}

// TransactionResults are the values of the result label of
// shepherd_bmdb_transactions_total.
var TransactionResults = []string{"committed", "retried", "rolled_back", "session_expired", "retries_exhausted", "failed"}

// NewMetrics creates the BMDB metrics and registers them with reg (nil:
// not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		transactions: metric.CounterVec(reg, "shepherd_bmdb_transactions_total",
			"BMDB transaction attempts by outcome: committed, retried (serialization failure or deadlock, run again), rolled_back (nothing to do, lease lost), session_expired, retries_exhausted, failed.", "result"),
		sessionsStarted: metric.CounterVec(reg, "shepherd_bmdb_sessions_started_total",
			"BMDB sessions started by this process, by component.", "component"),
		sessionsExpired: metric.CounterVec(reg, "shepherd_bmdb_sessions_expired_total",
			"BMDB sessions of this process that expired before being closed (heartbeat failed or local deadline passed), by component.", "component"),
		sessionsReaped: metric.Counter(reg, "shepherd_bmdb_sessions_reaped_total",
			"Expired BMDB sessions (of any replica) deleted by this process's reaper."),
		leasesReaped: metric.Counter(reg, "shepherd_bmdb_leases_reaped_total",
			"Work leases of expired sessions released by this process's reaper and recorded as Lost."),
		historyPruned: metric.Counter(reg, "shepherd_bmdb_history_pruned_total",
			"work_history events older than the retention deleted by this process."),
		endsPerCommit: metric.Histogram(reg, "shepherd_bmdb_lease_ends_per_transaction",
			"Lease ends (finish, reschedule, fail, cancel) carried by one transaction: a session's concurrent ends share a commit.",
			[]float64{1, 2, 4, 8, 16, 32, 64, 128}),
		prepared: metric.Gauge(reg, "shepherd_bmdb_statements_prepared",
			"1 when the BMDB's connections prepare their statements (no transaction-mode pooler found); 0 when statements are sent unnamed, parsed and planned at every execution (a pooler, no probe yet, or the DSN's default_query_exec_mode)."),
	}
	for _, r := range TransactionResults {
		m.transactions.WithLabelValues(r)
	}
	m.ha = newHAMetrics(reg)
	m.recovery = newRecoveryMetrics(reg)
	return m
}

// InitComponent makes the per-component series exist at zero.
func (m *Metrics) InitComponent(component string) {
	if m == nil {
		return
	}
	m.sessionsStarted.WithLabelValues(component)
	m.sessionsExpired.WithLabelValues(component)
}

func (m *Metrics) transaction(result string) {
	if m != nil {
		m.transactions.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) endsCommitted(n int) {
	if m != nil {
		m.endsPerCommit.Observe(float64(n))
	}
}

func (m *Metrics) sessionStarted(component string) {
	if m != nil {
		m.sessionsStarted.WithLabelValues(component).Inc()
	}
}

func (m *Metrics) sessionExpired(component string) {
	if m != nil {
		m.sessionsExpired.WithLabelValues(component).Inc()
	}
}

func (m *Metrics) reaped(sessions, leases int) {
	if m != nil {
		m.sessionsReaped.Add(float64(sessions))
		m.leasesReaped.Add(float64(leases))
	}
}

func (m *Metrics) pruned(n int64) {
	if m != nil {
		m.historyPruned.Add(float64(n))
	}
}

func (m *Metrics) statementsPrepared(v bool) {
	if m == nil {
		return
	}
	if v {
		m.prepared.Set(1)
	} else {
		m.prepared.Set(0)
	}
}
