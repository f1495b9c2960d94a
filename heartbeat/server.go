// Package heartbeat is Shepherd's endpoint for agent heartbeats: the HTTP
// handler (and, if wanted, the server) that accepts the signed heartbeats
// of agentproto and records them in machine_agent_heartbeat, which is what
// keeps a machine out of Recovery.
//
// Anyone who can reach the endpoint can send it anything, so a request is
// only recorded when its signature verifies with the public key the
// machine's agent answered AgentStart with, its timestamp is within
// MaxClockSkew of this server's clock, and it is newer than the machine's
// last accepted heartbeat. The checks run cheapest first, and a flood from
// one source must not crowd out the agents, not even those behind the same
// address (a NAT, a source-NATing load balancer):
//
//  1. Connections are capped, in total and per source address, and idle
//     ones closed soon (Options.MaxConns, MaxConnsPerSource, IdleTimeout;
//     Serve only).
//  2. The body is bounded (agentproto.MaxHeartbeatSize) and decoded
//     strictly; then the timestamp window and the per-machine replay check
//     run from memory.
//  3. The agent's key comes from an in-memory cache, filled from the BMDB
//     in batches (see keyLoader; at most Options.MaxKeyLookups reads at
//     once): a flood of forged heartbeats for a known machine costs no
//     database work. A lookup (a cache miss, or a re-read after a
//     signature failed) takes a token from the source's bucket first
//     (Options.SourceRate, SourceBurst), and a source with none left is
//     refused (429) instead; the token is given back when the heartbeat is
//     accepted. Nothing else is limited per source: the checks of 2 and a
//     signature checked against a cached key cost no more than a valid
//     heartbeat does, so a source's refusals never make its valid
//     heartbeats wait or fail.
//  4. Verified heartbeats are written in batches by one writer (see
//     recorder), conditionally on the key still being the machine's agent
//     key, so that the cache can never make a replaced agent's heartbeat
//     count.
//
// Replays: a heartbeat is accepted only if its signed timestamp is newer
// than the last one accepted for the machine. Each replica checks that in
// memory first (cheap, before any key lookup), and the batched write checks
// it again against the timestamp the BMDB keeps for the machine, so that a
// captured heartbeat replayed to another replica, or to a restarted one, is
// refused too.
package heartbeat

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/connlimit"
)

// Path is where Handler serves heartbeats. Shepherd's agent-start code
// builds the agents' heartbeat_url from the endpoint's external address and
// this path.
const Path = "/agent/v1/heartbeat"

// Defaults of Options' connection limits, exported for the flags that set
// them. DefaultMaxConns keeps what a flood of idle TLS connections holds
// well under the daemon's memory budget (256 MiB under any hostile peer);
// DefaultMaxConnsPerSource leaves half of them to other addresses, and
// still exceeds the agents that one NAT address commonly carries.
const (
	DefaultMaxConns          = 2048
	DefaultMaxConnsPerSource = 1024
	DefaultIdleTimeout       = 15 * time.Second
)

// Options tunes a Server. The zero value gives the documented defaults.
type Options struct {
	// Metrics counts requests by result; nil counts nothing.
	Metrics *Metrics
	// MaxClockSkew is how far a heartbeat's timestamp may be from this
	// server's clock, either way (default 60 s). Agents' clocks must be
	// that close to Shepherd's; it also bounds cross-replica replays (see
	// the package documentation).
	MaxClockSkew time.Duration
	// SourceRate and SourceBurst are each source's token bucket of agent
	// key lookups in the BMDB that find no valid key (default 20/s, burst
	// 40). A request that needs a lookup (its machine's key is not cached,
	// or its signature failed with the cached key and KeyRefetchInterval
	// allows a re-read) takes a token before the lookup, and is refused
	// at once (429) if the source has none; the token is given back if
	// the heartbeat is then accepted (or the database fails). So the
	// source's concurrent lookups are bounded by the burst, and it pays
	// only for lookups of machines that have no agent and for forgeries.
	// Requests that need no lookup are never limited: valid heartbeats of
	// machines whose key is cached are accepted, and malformed, stale,
	// replayed ones and forgeries refused by the cached key get their own
	// refusal, however many of them share the source. Healthy agents
	// behind one NAT or load-balancer address keep being accepted beside
	// a noisy neighbour.
	SourceRate  rate.Limit
	SourceBurst int
	// MaxSources bounds how many sources' buckets are kept (default
	// 100000); beyond that, refilled buckets and then arbitrary ones are
	// forgotten.
	MaxSources int
	// SourceKey names the source of a request for rate limiting (nil:
	// RemoteIPKey, which Serve computes from the connection's address
	// without making a net/http request of it).
	SourceKey func(*http.Request) string
	// MaxKeyLookups bounds concurrent reads of agent keys from the BMDB
	// (default 2), so that heartbeats for machines whose key is not cached
	// (mostly forgeries, from many sources) cannot take the database's
	// connections from everything else. Each read fetches the keys of up to
	// MaxBatch machines, those whose lookups waited for it: a cold cache
	// under a large fleet's load costs a transaction per batch, not per
	// heartbeat.
	MaxKeyLookups int
	// KeyCacheTTL is how long an agent key (and the machine's last
	// timestamp) stays cached without use (default 10 min, at least
	// 2*MaxClockSkew + 1 min). The key cache is an optimization: the write
	// re-checks the key.
	KeyCacheTTL time.Duration
	// KeyRefetchInterval is the shortest time between two reads of the
	// same machine's key after a signature failed to verify with the cached
	// one (default 5 s): often enough to pick up a restarted agent's new
	// key at once, rarely enough that forgeries cannot hammer the database.
	KeyRefetchInterval time.Duration
	// MaxMachines bounds the per-machine state (cached key, last accepted
	// timestamp) (default 1<<20). Entries exist only for machines with a
	// recorded agent, so the fleet size bounds it anyway.
	MaxMachines int
	// MaxBatch bounds the heartbeats written in one statement, and the
	// keys read in one (default 2000). One writer writes every batch, so
	// this also bounds the endpoint's rate: MaxBatch per statement's
	// duration (a batch of 2000 takes tens of milliseconds).
	MaxBatch int
	// BatchDelay is how long a batch (a write of heartbeats, a read of
	// keys) that starts while requests keep arriving, right after the
	// previous batch, waits to fill up to a quarter of MaxBatch (default
	// 20 ms). An idle
	// endpoint writes at once; under load, heartbeats wait up to this much
	// longer, and the database sees one transaction per MaxBatch
	// heartbeats or per BatchDelay, whichever comes first, instead of one
	// per statement's duration. Negative: no wait.
	BatchDelay time.Duration
	// DBTimeout bounds each BMDB operation, including the wait for a
	// lookup slot (default 5 s).
	DBTimeout time.Duration

	// MaxConns, MaxConnsPerSource and IdleTimeout bound the connections
	// of Serve and ListenAndServe (Handler leaves that to its server).
	// Every connection costs a file descriptor and memory while it is
	// open, idle or not: a goroutine's stack, the server's buffers and,
	// with TLS, the connection's state, tens of KiB in all (docs/bad-input.md's
	// table of bad input has the figure measured through the binary). The
	// endpoint's memory is bounded by MaxConns times that, and what one
	// source can make it hold by MaxConnsPerSource times that.
	//
	// At either cap, the least recently used connection that carries no
	// request (an idle keep-alive, or one whose TLS handshake is not
	// complete or that has not sent a byte of a request yet) is closed to
	// admit a new one, of the same source when that source is at its cap;
	// only when every connection carries a request is the new one closed
	// at once, and counted in shepherd_heartbeat_connections_refused_total
	// (those closed to make room in ..._evicted_total). So the agents
	// behind an address keep reporting however many they are, each
	// heartbeat on a new connection beyond the cap, and a neighbour
	// behind it that opens connections and sends nothing holds none for
	// long.
	//
	// MaxConns bounds the open connections (default DefaultMaxConns).
	// Keep it below the process's file descriptor limit, with room for
	// the rest of the daemon.
	MaxConns int
	// MaxConnsPerSource bounds the open connections of one source
	// address, as RemoteIPKey names it (default
	// DefaultMaxConnsPerSource). An agent holds one (keep-alive)
	// connection; agents beyond this many behind one NAT or load
	// balancer cost a TLS handshake per heartbeat.
	MaxConnsPerSource int
	// IdleTimeout closes a keep-alive connection that carried no request
	// for this long (default DefaultIdleTimeout: three of the agents'
	// default 5 s interval, so that an agent keeps its connection through
	// a missed beat and never races the close at its next one, while idle
	// connections nobody uses go within seconds). A connection that has
	// not completed its TLS handshake and its first request within 5 s is
	// closed too, and so is one whose later request takes longer than 5 s
	// from its first byte.
	IdleTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = 60 * time.Second
	}
	if o.SourceRate <= 0 {
		o.SourceRate = 20
	}
	if o.SourceBurst <= 0 {
		o.SourceBurst = 40
	}
	if o.MaxSources <= 0 {
		o.MaxSources = 100000
	}
	if o.MaxKeyLookups <= 0 {
		o.MaxKeyLookups = 2
	}
	if o.KeyCacheTTL <= 0 {
		o.KeyCacheTTL = 10 * time.Minute
	}
	// An entry swept while its last timestamp could still pass the skew
	// check would let that heartbeat be replayed.
	if o.KeyCacheTTL < 2*o.MaxClockSkew+time.Minute {
		o.KeyCacheTTL = 2*o.MaxClockSkew + time.Minute
	}
	if o.KeyRefetchInterval <= 0 {
		o.KeyRefetchInterval = 5 * time.Second
	}
	if o.MaxMachines <= 0 {
		o.MaxMachines = 1 << 20
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 2000
	}
	if o.BatchDelay == 0 {
		o.BatchDelay = 20 * time.Millisecond
	}
	if o.DBTimeout <= 0 {
		o.DBTimeout = 5 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxConnsPerSource <= 0 {
		o.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	if o.MaxConnsPerSource > o.MaxConns {
		o.MaxConnsPerSource = o.MaxConns
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	return o
}

// Server checks and records agent heartbeats. It is safe for concurrent
// use and holds no goroutines of its own.
type Server struct {
	db       *bmdb.DB
	opts     Options
	limiters *sourceLimiters
	keys     *keyLoader
	recorder *recorder
	verifier *verifier
	errLog   rateLimitedLog
	connLog  rateLimitedLog // connections refused by MaxConns, MaxConnsPerSource
	// conns is the connection limiter of the last Serve, for tests.
	conns atomic.Pointer[connlimit.Listener]

	// epoch is when the server was made: machineState's times are
	// durations since then, on the monotonic clock.
	epoch time.Time

	// preloadPage is how many keys Preload reads a transaction.
	preloadPage int

	mu        sync.Mutex
	machines  map[uuid.UUID]machineState
	lastSweep time.Time
}

// machineState is what the server remembers of a machine's agent. It holds
// no pointer, so that the garbage collector does not walk the entries of a
// million machines at every cycle, and the map holds the states themselves.
type machineState struct {
	key    [ed25519.PublicKeySize]byte // as recorded in machine_agent_started
	hasKey bool
	// keyFetched and lastUsed: since Server.epoch.
	keyFetched time.Duration
	lastUsed   time.Duration
	// lastTS is the signed timestamp of the last accepted heartbeat, in
	// Unix nanoseconds (0: none; heartbeats are signed after 1970).
	lastTS int64
}

// New returns a Server recording heartbeats in db.
func New(db *bmdb.DB, opts Options) *Server {
	opts = opts.withDefaults()
	return &Server{
		db:       db,
		opts:     opts,
		limiters: newSourceLimiters(opts.SourceRate, opts.SourceBurst, opts.MaxSources),
		keys:     &keyLoader{db: db, maxBatch: opts.MaxBatch, slots: opts.MaxKeyLookups, timeout: opts.DBTimeout, linger: newLinger(opts.BatchDelay)},
		recorder: &recorder{db: db, maxBatch: opts.MaxBatch, timeout: opts.DBTimeout, linger: newLinger(opts.BatchDelay)},
		verifier: newVerifier(),
		epoch:    time.Now(),
		machines: make(map[uuid.UUID]machineState),

		preloadPage: defaultPreloadPage,
	}
}

// Handler returns the HTTP handler of the endpoint: POST Path. Other paths
// get 404 and are not counted.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(Path, s)
	return mux
}

// ServeHTTP handles one heartbeat request. Success is 204 No Content; a
// refusal has a status (400, 403, 405, 413, 429, 503) and a one-line
// plain-text reason, which the agent logs.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	result, status, reason := s.serveHTTP(w, r)
	s.counted(r.Context(), result, remoteAddr(r.RemoteAddr), reason)
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "%s: %s\n", result, reason)
}

// serveHTTP reads a net/http request's body for handle.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) (result string, status int, reason string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return ResultBadRequest, http.StatusMethodNotAllowed, notPosted
	}
	buf := bodyBuffers.Get().(*[]byte)
	defer bodyBuffers.Put(buf)
	body, err := readBody(http.MaxBytesReader(w, r.Body, agentproto.MaxHeartbeatSize), (*buf)[:0])
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return ResultBadRequest, http.StatusRequestEntityTooLarge, bodyTooLarge
		}
		return ResultBadRequest, http.StatusBadRequest, "reading body failed"
	}
	return s.handle(r.Context(), body, func() string {
		if s.opts.SourceKey == nil {
			return RemoteIPKey(r)
		}
		return s.opts.SourceKey(r)
	})
}

// The reasons of the refusals that either server in front of handle gives
// before handle runs.
const notPosted = "heartbeats are POSTed"

var bodyTooLarge = fmt.Sprintf("body larger than %d bytes", agentproto.MaxHeartbeatSize)

// counted counts a request's result and logs a refusal (at V(2)), with the
// client's address, formatted only then.
func (s *Server) counted(ctx context.Context, result string, remote net.Addr, reason string) {
	s.opts.Metrics.count(result)
	if result != ResultAccepted && result != ResultRateLimited {
		if logger := klog.FromContext(ctx).V(2); logger.Enabled() {
			logger.Info("Heartbeat refused", "result", result, "source", remote.String(), "reason", reason)
		}
	}
}

// remoteAddr is net/http's Request.RemoteAddr as a net.Addr.
type remoteAddr string

func (a remoteAddr) Network() string { return "tcp" }
func (a remoteAddr) String() string  { return string(a) }

// handle runs the checks of a heartbeat request's body in order of cost and
// returns the result label, the HTTP status and a reason for the client.
// sourceOf names the request's source; it is asked for only when a key
// lookup in the BMDB must take a token of the source's bucket first (see
// Options.SourceRate). ctx bounds the waits for lookups and carries the
// logger.
func (s *Server) handle(ctx context.Context, body []byte, sourceOf func() string) (result string, status int, reason string) {
	hb, err := agentproto.DecodeHeartbeat(body)
	if err != nil {
		return ResultBadRequest, http.StatusBadRequest, err.Error()
	}

	now := time.Now()
	if d := hb.Timestamp.Sub(now); d > s.opts.MaxClockSkew || d < -s.opts.MaxClockSkew {
		return ResultStale, http.StatusForbidden, fmt.Sprintf("timestamp %s is more than %s from the server's clock %s",
			hb.Timestamp.UTC().Format(time.RFC3339Nano), s.opts.MaxClockSkew, now.UTC().Format(time.RFC3339Nano))
	}
	if s.replayed(hb) {
		return ResultReplay, http.StatusForbidden, "timestamp not newer than the machine's last accepted heartbeat"
	}

	// A token taken for a lookup is given back if the heartbeat is
	// accepted, or the server failed it: the source pays only for lookups
	// that found no valid key.
	charged := false
	var source string
	defer func() {
		if charged && (result == ResultAccepted || result == ResultError) {
			s.limiters.refund(source, time.Now())
		}
	}()
	const lookupsSpent = "this source's key lookups that found no valid key exceed its rate; heartbeats of machines whose key is cached are still accepted"
	keyLookupFailed := func(err error) (string, int, string) {
		if errors.Is(err, bmdb.ErrNotFound) {
			return ResultUnknownMachine, http.StatusForbidden, "no agent is recorded for this machine"
		}
		s.logError(ctx, "Looking up an agent key failed", err)
		return ResultError, http.StatusServiceUnavailable, "agent key lookup failed, retry later"
	}
	key, cached := s.cachedKey(hb.MachineID, now)
	if !cached {
		source = sourceOf()
		if !s.limiters.take(source, now) {
			return ResultRateLimited, http.StatusTooManyRequests, lookupsSpent
		}
		charged = true
		if key, err = s.fetchKey(ctx, hb.MachineID); err != nil {
			return keyLookupFailed(err)
		}
	}
	if !s.verifier.verify(hb, key) {
		// The agent may have been restarted with a new key since the key
		// was cached: read it again, but not on every forgery. The
		// machine's re-read is claimed only once the source has paid for
		// it, so that a spent source cannot use it up for others.
		valid := false
		if cached && s.refetchDue(hb.MachineID, now) {
			source = sourceOf()
			if !s.limiters.take(source, now) {
				return ResultRateLimited, http.StatusTooManyRequests, lookupsSpent
			}
			charged = true
			if s.mayRefetch(hb.MachineID, now) {
				if key, err = s.fetchKey(ctx, hb.MachineID); err != nil {
					return keyLookupFailed(err)
				}
				valid = hb.Verify(key) == nil
			} else {
				// Another request claimed the re-read meanwhile.
				charged = false
				s.limiters.refund(source, now)
			}
		}
		if !valid {
			return ResultBadSignature, http.StatusForbidden, "signature does not verify with the machine's agent key"
		}
	}
	if !s.advance(hb, now) {
		return ResultReplay, http.StatusForbidden, "timestamp not newer than the machine's last accepted heartbeat"
	}

	recorded, stale, err := s.recorder.record(bmdb.AgentKey{Machine: hb.MachineID, PublicKey: key, Timestamp: hb.Timestamp, BootID: hb.BootID})
	switch {
	case err != nil:
		s.logError(ctx, "Recording heartbeats failed", err)
		return ResultError, http.StatusServiceUnavailable, "recording the heartbeat failed, retry later"
	case stale:
		// Another replica, or this one before a restart, recorded a newer
		// heartbeat of this agent: this one is a replay.
		return ResultReplay, http.StatusForbidden, "timestamp not newer than the machine's last recorded heartbeat"
	case !recorded:
		// Between the key lookup and the write, the machine's agent was
		// replaced or its tags deleted: this signer is no longer its agent.
		s.forgetKey(hb.MachineID)
		return ResultBadSignature, http.StatusForbidden, "signed by an agent that is no longer the machine's recorded agent"
	}
	return ResultAccepted, http.StatusNoContent, ""
}

// bodyBuffers holds request body buffers: a heartbeat is decoded (and
// copied out of its buffer) before the handler returns.
var bodyBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, agentproto.MaxHeartbeatSize+1)
	return &b
}}

// readBody reads r to its end into buf, which it grows only for bodies
// larger than its capacity (MaxBytesReader stops those first).
func readBody(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// replayed reports whether hb is not newer than the last heartbeat accepted
// for its machine. It is a cheap early check, before any key lookup; advance
// decides for good.
func (s *Server) replayed(hb agentproto.Heartbeat) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[hb.MachineID]
	return ok && hb.Timestamp.UnixNano() <= m.lastTS
}

// advance records hb's timestamp as the machine's last accepted one, unless
// a concurrent request got there first with a newer or equal timestamp
// (two copies of one heartbeat racing). It runs after verification only:
// an unauthenticated request must not move it.
func (s *Server) advance(hb agentproto.Heartbeat, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.state(hb.MachineID, now)
	ts := hb.Timestamp.UnixNano()
	if ts <= m.lastTS {
		return false
	}
	m.lastTS = ts
	m.lastUsed = s.since(now)
	s.machines[hb.MachineID] = m
	return true
}

// cachedKey returns machine's agent key if it is cached.
func (s *Server) cachedKey(machine uuid.UUID, now time.Time) (ed25519.PublicKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[machine]
	if !ok || !m.hasKey {
		return nil, false
	}
	m.lastUsed = s.since(now)
	s.machines[machine] = m
	key := m.key
	return key[:], true
}

// fetchKey reads machine's agent key from the BMDB and caches it. Errors
// wrap bmdb.ErrNotFound when the machine has no recorded agent.
func (s *Server) fetchKey(ctx context.Context, machine uuid.UUID) (ed25519.PublicKey, error) {
	now := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.opts.DBTimeout)
	defer cancel()
	key, err := s.keys.load(ctx, machine)
	if err != nil {
		if errors.Is(err, bmdb.ErrNotFound) {
			s.forgetKey(machine)
		}
		return nil, err
	}
	// Only keys that exist are cached: caching absences would let anyone
	// fill the cache with random machine ids, and would delay a newly
	// started agent's first heartbeat. A key of the wrong size, which
	// verifies nothing, is not cached either.
	s.mu.Lock()
	m := s.state(machine, now)
	m.hasKey = len(key) == ed25519.PublicKeySize
	copy(m.key[:], key)
	m.keyFetched, m.lastUsed = s.since(now), s.since(now)
	s.machines[machine] = m
	s.mu.Unlock()
	return key, nil
}

// refetchDue reports whether machine's key may be read again after a
// verification failure, without claiming the read (mayRefetch does).
func (s *Server) refetchDue(machine uuid.UUID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[machine]
	return ok && s.since(now)-m.keyFetched >= s.opts.KeyRefetchInterval
}

// mayRefetch reports whether machine's key may be read again after a
// verification failure, and if so notes the read.
func (s *Server) mayRefetch(machine uuid.UUID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[machine]
	if !ok || s.since(now)-m.keyFetched < s.opts.KeyRefetchInterval {
		return false
	}
	m.keyFetched = s.since(now)
	s.machines[machine] = m
	return true
}

// forgetKey drops machine's cached key (keeping its last timestamp, which
// still guards against replays).
func (s *Server) forgetKey(machine uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.machines[machine]; ok {
		m.hasKey = false
		s.machines[machine] = m
	}
}

// since is now as a machineState time.
func (s *Server) since(now time.Time) time.Duration { return now.Sub(s.epoch) }

// state returns machine's state, or a new one, which the caller stores
// (s.machines[machine] = m). Callers hold s.mu and only store states of
// machines with a recorded agent, which bounds the map by the fleet.
// Unused entries are swept after KeyCacheTTL: by then their last timestamp
// is long outside the clock-skew window, so forgetting it cannot let a
// replay through.
func (s *Server) state(machine uuid.UUID, now time.Time) machineState {
	if m, ok := s.machines[machine]; ok {
		return m
	}
	if now.Sub(s.lastSweep) >= time.Minute || len(s.machines) >= s.opts.MaxMachines {
		s.lastSweep = now
		for id, m := range s.machines {
			if s.since(now)-m.lastUsed >= s.opts.KeyCacheTTL {
				delete(s.machines, id)
			}
		}
		// Still full: the fleet outgrew MaxMachines. Forgetting an
		// arbitrary machine costs a key lookup, and opens a replay
		// window as in the multi-replica case.
		for id := range s.machines {
			if len(s.machines) < s.opts.MaxMachines {
				break
			}
			delete(s.machines, id)
		}
	}
	return machineState{lastUsed: s.since(now)}
}

// logError logs a failure of the server, but not one caused by the client
// hanging up.
func (s *Server) logError(ctx context.Context, msg string, err error) {
	if ctx.Err() == nil {
		s.errLog.log(klog.FromContext(ctx), msg, err)
	}
}

// rateLimitedLog logs errors at most every 10 seconds, with a count of those
// it left out: a database outage must not turn every heartbeat into a log
// line.
type rateLimitedLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *rateLimitedLog) log(logger klog.Logger, msg string, err error) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last) < 10*time.Second {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	logger.Error(err, msg, "suppressed_since_last", suppressed)
}
