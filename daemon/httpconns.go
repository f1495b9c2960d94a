package daemon

import (
	"context"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/connlimit"
)

// httpConnLimits are the -listen server's connection limits (package
// connlimit): Prometheus, the probes and a few operators need a handful
// of connections. One source is capped below the total, so that one
// client cannot fill the server with requests in progress either, and a
// few slots beyond the total are kept for /healthz and /readyz, one
// request per connection, for when every other slot holds a request in
// progress (each bounded by the server's header and read timeouts).
func httpConnLimits() connlimit.Limits {
	return connlimit.Limits{Total: maxHTTPConnections, PerSource: 64, ProbeReserve: 16, ProbeReservePerSource: 4}
}

// isProbe reports the paths a probe-only connection serves.
func isProbe(path string) bool {
	return path == "/healthz" || path == "/readyz" || strings.HasPrefix(path, "/readyz/")
}

// Actions of the limiting listener, the values of the action label of
// shepherd_http_connections_limited_total.
const (
	limitClosedIdle = "closed_idle" // an idle keep-alive closed to make room
	limitProbeOnly  = "probe_only"  // admitted to the probes' reserve
	limitRefused    = "refused"     // closed at once: no room
)

// newLimitListener limits l's connections; limited counts its actions
// (nil: not counted).
func newLimitListener(l net.Listener, limits connlimit.Limits, limited *prometheus.CounterVec) *connlimit.Listener {
	count := func(action string) func() {
		if limited == nil {
			return nil
		}
		c := limited.WithLabelValues(action)
		return c.Inc
	}
	refused := count(limitRefused)
	return connlimit.New(l, limits, connlimit.Hooks{
		Evicted:   count(limitClosedIdle),
		ProbeOnly: count(limitProbeOnly),
		Refused: func(string, bool) {
			if refused != nil {
				refused()
			}
		},
	})
}

type probeOnlyKey struct{}

// connContext marks the requests of a probe-only connection (the server's
// ConnContext hook).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if connlimit.ProbeOnly(c) {
		return context.WithValue(ctx, probeOnlyKey{}, true)
	}
	return ctx
}

// probeOnlyGuard serves a probe-only connection's request only if it is a
// probe, and closes the connection after it, so that the reserve is free
// again for the next probe.
func probeOnlyGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probeOnly, _ := r.Context().Value(probeOnlyKey{}).(bool); probeOnly {
			w.Header().Set("Connection", "close")
			if !isProbe(r.URL.Path) {
				w.Header().Set("Retry-After", "5")
				http.Error(w, "too many connections: this one serves /healthz and /readyz only", http.StatusServiceUnavailable)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
