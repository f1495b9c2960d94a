package heartbeat

import (
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/shepherd-fleet/shepherd/internal/connlimit"
)

// RemoteIPKey is the default Options.SourceKey: the client's IP address, or
// for IPv6 its /64, since one host commonly owns a whole /64 and could
// otherwise take a fresh limiter for every address in it. Behind a proxy or
// load balancer every request comes from the proxy: set SourceKey to read
// the client address the proxy forwards, from a header only that proxy can
// set.
func RemoteIPKey(r *http.Request) string { return connlimit.Source(r.RemoteAddr) }

// sourceLimiters holds a token bucket per source, in a bounded map. A
// token pays for one key lookup in the BMDB: take takes it before the
// lookup, so that concurrent requests of one source cannot run more lookups
// than its bucket holds, and refund gives it back when the request turns
// out to be accepted (or the database failed it), so that only lookups that
// found no valid key are paid for.
type sourceLimiters struct {
	limit rate.Limit
	burst float64
	max   int
	// idle is how long an unused bucket takes to refill: after that it is
	// indistinguishable from a new one and can be forgotten.
	idle time.Duration

	mu        sync.Mutex
	sources   map[string]*bucket
	lastSweep time.Time
}

// bucket is a source's token bucket: tokens as of last.
type bucket struct {
	tokens   float64
	last     time.Time
	lastSeen time.Time
}

func newSourceLimiters(limit rate.Limit, burst, max int) *sourceLimiters {
	idle := time.Minute
	if limit > 0 && limit != rate.Inf {
		idle = time.Duration(float64(burst)/float64(limit)*float64(time.Second)) + time.Second
	}
	return &sourceLimiters{limit: limit, burst: float64(burst), max: max, idle: idle, sources: make(map[string]*bucket)}
}

// take takes a token from source's bucket and reports whether it had one.
func (l *sourceLimiters) take(source string, now time.Time) bool {
	if l.limit == rate.Inf {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.sources[source]
	if !ok {
		if len(l.sources) >= l.max {
			l.makeRoom(now)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.sources[source] = b
	}
	l.refill(b, now)
	b.lastSeen = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// refund gives back a token that take took, up to the burst. A bucket
// forgotten meanwhile is new again, and full: there is nothing to give back.
func (l *sourceLimiters) refund(source string, now time.Time) {
	if l.limit == rate.Inf {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.sources[source]; ok {
		l.refill(b, now)
		b.tokens = min(l.burst, b.tokens+1)
	}
}

// refill adds the tokens earned since b.last. Callers hold l.mu.
func (l *sourceLimiters) refill(b *bucket, now time.Time) {
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+elapsed.Seconds()*float64(l.limit))
		b.last = now
	}
}

// makeRoom frees at least one slot. It forgets refilled buckets (at most
// once a second, so that a full map of active sources does not make every
// new source pay a full scan), and otherwise an arbitrary one: that source
// gets a fresh bucket when it comes back, which bounds what it gains to one
// burst.
func (l *sourceLimiters) makeRoom(now time.Time) {
	if now.Sub(l.lastSweep) >= time.Second {
		l.lastSweep = now
		for k, b := range l.sources {
			if now.Sub(b.lastSeen) >= l.idle {
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
