package heartbeat

import (
	"fmt"
	"net"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/connlimit"
)

// limitConns limits ln's connections (package connlimit): at most
// Options.MaxConns open, and Options.MaxConnsPerSource of one source
// address (as RemoteIPKey names it), so that nobody can hold the
// endpoint's memory and file descriptors with idle connections. At a
// limit, the least recently used connection that carries no request (an
// idle keep-alive, or one that has not sent a byte yet) is closed to make
// room: the agents behind a NAT with more of them than MaxConnsPerSource
// still report, each heartbeat on a new connection. A connection refused
// (every one of its source, or of the endpoint, carries a request) is
// counted and logged, at most every 10 seconds.
func (s *Server) limitConns(ln net.Listener, logger klog.Logger) *connlimit.Listener {
	maxTotal, maxPerSource := s.opts.MaxConns, s.opts.MaxConnsPerSource
	return connlimit.New(ln, connlimit.Limits{Total: maxTotal, PerSource: maxPerSource, EvictNew: true}, connlimit.Hooks{
		Evicted: s.opts.Metrics.connEvicted,
		Refused: func(source string, sourceFull bool) {
			s.opts.Metrics.connRefused()
			what := fmt.Sprintf("the endpoint has %d connections open (Options.MaxConns)", maxTotal)
			if sourceFull {
				what = fmt.Sprintf("source %s has %d connections open (Options.MaxConnsPerSource)", source, maxPerSource)
			}
			s.connLog.log(logger, "Heartbeat connection refused", fmt.Errorf("%s, each carrying a request", what))
		},
	})
}
