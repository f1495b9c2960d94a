package heartbeat

import "github.com/prometheus/client_golang/prometheus"

// Results of a heartbeat request, the values of the result label of
// shepherd_heartbeats_total.
const (
	// ResultAccepted: verified and recorded in machine_agent_heartbeat.
	ResultAccepted = "accepted"
	// ResultBadRequest: not a well-formed heartbeat (method, size, JSON,
	// fields, protocol version).
	ResultBadRequest = "bad_request"
	// ResultBadSignature: the signature does not verify with the public key
	// of the machine's recorded agent (a wrong key, a wrong machine id, a
	// forgery, or an agent that has since been replaced).
	ResultBadSignature = "bad_signature"
	// ResultUnknownMachine: no agent is recorded for the machine (it does
	// not exist, or AgentStart has not started one, or Recovery removed it).
	ResultUnknownMachine = "unknown_machine"
	// ResultStale: the timestamp is further from the server's clock than
	// Options.MaxClockSkew, in either direction.
	ResultStale = "stale"
	// ResultReplay: the timestamp is not newer than the last heartbeat this
	// server accepted from the machine.
	ResultReplay = "replay"
	// ResultRateLimited: the request needed a lookup of an agent key in
	// the BMDB, and its source has spent its budget of lookups that found
	// no valid key (Options.SourceRate).
	ResultRateLimited = "rate_limited"
	// ResultError: the BMDB failed or was too busy; the agent retries at its
	// next interval.
	ResultError = "error"
)

// Results lists every value of the result label.
var Results = []string{
	ResultAccepted, ResultBadRequest, ResultBadSignature, ResultUnknownMachine,
	ResultStale, ResultReplay, ResultRateLimited, ResultError,
}

// Metrics counts what the heartbeat endpoint does. A nil *Metrics counts
// nothing.
type Metrics struct {
	heartbeats *prometheus.CounterVec
	byResult   map[string]prometheus.Counter // the series of Results, resolved once
	// connsRefused counts connections closed at once at a connection
	// cap, connsEvicted connections that carried no request closed to
	// make room for a new one (see Options.MaxConns).
	connsRefused, connsEvicted prometheus.Counter
}

// NewMetrics creates the heartbeat metrics and registers them with reg.
// Every result series exists at zero from the start, so that alerts on
// rates (say, of bad_signature) work before the first such request.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shepherd_heartbeats_total",
			Help: "Agent heartbeat requests received by this replica, by result: accepted, bad_request, bad_signature, unknown_machine, stale, replay, rate_limited, error.",
		}, []string{"result"}),
	}
	m.byResult = make(map[string]prometheus.Counter, len(Results))
	for _, r := range Results {
		m.byResult[r] = m.heartbeats.WithLabelValues(r)
	}
	m.connsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shepherd_heartbeat_connections_refused_total",
		Help: "Connections to the heartbeat endpoint closed at once because the endpoint, or their source address, had the most connections it may open, each carrying a request (heartbeat.Options.MaxConns, MaxConnsPerSource).",
	})
	m.connsEvicted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shepherd_heartbeat_connections_evicted_total",
		Help: "Connections to the heartbeat endpoint that carried no request (idle, or handshake or first request not complete), closed to admit a new one at the endpoint's or the source's connection cap.",
	})
	reg.MustRegister(m.heartbeats, m.connsRefused, m.connsEvicted)
	return m
}

func (m *Metrics) connRefused() {
	if m != nil {
		m.connsRefused.Inc()
	}
}

func (m *Metrics) connEvicted() {
	if m != nil {
		m.connsEvicted.Inc()
	}
}

func (m *Metrics) count(result string) {
	if m != nil {
		m.byResult[result].Inc()
	}
}
