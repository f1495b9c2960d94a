package heartbeat

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RemoteIPKey is the default Options.SourceKey: the client's IP address, or
// for IPv6 its /64, since one host commonly owns a whole /64 and could
// otherwise take a fresh limiter for every address in it. Behind a proxy or
// load balancer every request comes from the proxy: set SourceKey to read
// the client address the proxy forwards, from a header only that proxy can
// set.
func RemoteIPKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		if p, err := addr.Prefix(64); err == nil {
			return p.String()
		}
	}
	return addr.String()
}

// sourceLimiters holds a token bucket per source, in a bounded map.
type sourceLimiters struct {
	limit rate.Limit
	burst int
	max   int
	// idle is how long an unused bucket takes to refill: after that it is
	// indistinguishable from a new one and can be forgotten.
	idle time.Duration

	mu        sync.Mutex
	sources   map[string]*sourceLimiter
	lastSweep time.Time
}

type sourceLimiter struct {
	lim      *rate.Limiter
	lastSeen time.Time
}

func newSourceLimiters(limit rate.Limit, burst, max int) *sourceLimiters {
	idle := time.Minute
	if limit > 0 && limit != rate.Inf {
		idle = time.Duration(float64(burst)/float64(limit)*float64(time.Second)) + time.Second
	}
	return &sourceLimiters{limit: limit, burst: burst, max: max, idle: idle, sources: make(map[string]*sourceLimiter)}
}

// exhausted reports whether source has spent its bucket: its requests are
// refused at once until it refills. It takes no token, so that a source
// whose requests are all accepted never runs out.
func (l *sourceLimiters) exhausted(source string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.sources[source]
	return ok && s.lim.TokensAt(now) < 1
}

// charge takes a token from source's bucket, for a request that cost the
// server work and was refused.
func (l *sourceLimiters) charge(source string, now time.Time) { l.allow(source, now) }

// allow takes a token from source's bucket.
func (l *sourceLimiters) allow(source string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.sources[source]
	if !ok {
		if len(l.sources) >= l.max {
			l.makeRoom(now)
		}
		s = &sourceLimiter{lim: rate.NewLimiter(l.limit, l.burst)}
		l.sources[source] = s
	}
	s.lastSeen = now
	return s.lim.AllowN(now, 1)
}

// makeRoom frees at least one slot. It forgets refilled buckets (at most
// once a second, so that a full map of active sources does not make every
// new source pay a full scan), and otherwise an arbitrary one: that source
// gets a fresh bucket when it comes back, which bounds what it gains to one
// burst.
func (l *sourceLimiters) makeRoom(now time.Time) {
	if now.Sub(l.lastSweep) >= time.Second {
		l.lastSweep = now
		for k, s := range l.sources {
			if now.Sub(s.lastSeen) >= l.idle {
				delete(l.sources, k)
			}
		}
	}
	for k := range l.sources {
		if len(l.sources) < l.max {
			break
		}
		delete(l.sources, k)
	}
}
