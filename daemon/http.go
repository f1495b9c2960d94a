package daemon

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/connlimit"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// readyPingTimeout bounds the database ping of /readyz: a probe that hangs
// on a dead database would be as bad as a wrong answer.
const readyPingTimeout = time.Second

// readiness is what /readyz reports on: named checks, after
// controller-runtime's healthz. The daemon fills it in as it starts: until
// the loops run (database schema checked, fleet seeded), and again once it
// is stopping, the check "running" fails with the phase, and the other
// built-in checks are not run.
type readiness struct {
	state atomic.Pointer[readyState]
	// checks are every check in the order /readyz lists them: the
	// built-in ones (those of readyNames), then the program's own.
	checks []readyzCheck
}

type readyState struct {
	// phase is "" while running, else why the daemon is not (yet) ready.
	phase string
	// What the built-in checks check while the daemon runs.
	db          *bmdb.DB
	runners     []*controlloop.Runner
	agents      *agentEndpoint // nil: no heartbeat endpoint
	stallWindow time.Duration
}

// readyzCheck is a named readiness check: one of the program's own
// (AddReadyzCheck), or a built-in one, which checks the running daemon's
// parts.
type readyzCheck struct {
	name    string
	check   func(*http.Request) error
	builtin func(*readyState, *http.Request) error
}

// newReadiness returns the readiness of a daemon starting, with the
// built-in checks, "agents" if it serves heartbeats, then own.
func newReadiness(agents bool, own []readyzCheck) *readiness {
	r := &readiness{checks: []readyzCheck{
		{name: checkRunning, builtin: func(st *readyState, _ *http.Request) error {
			if st.phase != "" {
				return errors.New(st.phase)
			}
			return nil
		}},
		{name: checkDatabase, builtin: func(st *readyState, req *http.Request) error {
			ctx, cancel := context.WithTimeout(req.Context(), readyPingTimeout)
			defer cancel()
			return st.db.Ping(ctx)
		}},
		{name: checkSessions, builtin: func(st *readyState, _ *http.Request) error {
			var lost []string
			for _, rn := range st.runners {
				if !rn.Ready() {
					lost = append(lost, rn.Info().Label)
				}
			}
			if len(lost) > 0 {
				return fmt.Errorf("no live BMDB session: %s", strings.Join(lost, ", "))
			}
			return nil
		}},
	}}
	if agents {
		r.checks = append(r.checks, readyzCheck{name: checkAgents, builtin: func(st *readyState, req *http.Request) error {
			return st.agents.check(req)
		}})
	}
	// Readiness reflects progress, not only a ping: heartbeats, reaps and
	// transactions that keep failing (a locked table, statements timing
	// out, a broken reaper) make the replica not ready.
	r.checks = append(r.checks, readyzCheck{name: checkStalled, builtin: func(st *readyState, _ *http.Request) error {
		if p := st.db.Stalled(st.stallWindow); p != "" {
			return errors.New(p)
		}
		return nil
	}})
	r.checks = append(r.checks, own...)
	r.set("starting")
	return r
}

// Names of the built-in readiness checks.
const (
	checkRunning  = "running"  // the daemon runs its loops: not starting or stopping
	checkDatabase = "database" // the BMDB answers a ping
	checkSessions = "sessions" // every loop has a live BMDB session
	checkAgents   = "agents"   // the heartbeat endpoint serves (with -agent_listen)
	checkStalled  = "stalled"  // heartbeats, reaps and transactions succeed
)

// isBuiltinCheck reports whether name is a built-in check's.
func isBuiltinCheck(name string) bool {
	switch name {
	case checkRunning, checkDatabase, checkSessions, checkAgents, checkStalled:
		return true
	}
	return false
}

// maxReasonBytes bounds a failed check's reason on /readyz: a reason may
// quote a database's or a program's error.
const maxReasonBytes = 512

func (r *readiness) set(phase string) { r.state.Store(&readyState{phase: phase}) }

// running marks the daemon running: every check is run, the built-in
// ones on what st holds.
func (r *readiness) running(st *readyState) { r.state.Store(st) }

// result is one check's outcome on /readyz.
type result struct {
	name string
	err  error
}

// run runs the checks not excluded, in order, and returns their results
// and the exclusions that matched no check.
func (r *readiness) run(req *http.Request, exclude []string) ([]result, []string) {
	st := r.state.Load()
	excluded := map[string]bool{}
	for _, name := range exclude {
		excluded[name] = true
	}
	var results []result
	for _, c := range r.checks {
		if excluded[c.name] {
			delete(excluded, c.name)
			continue
		}
		var err error
		switch {
		case c.builtin == nil:
			err = c.check(req)
		case st.phase != "" && c.name != checkRunning:
			err = errors.New("not checked: the daemon is not running")
		default:
			err = c.builtin(st, req)
		}
		results = append(results, result{name: c.name, err: err})
	}
	var unmatched []string
	for _, name := range exclude {
		if excluded[name] {
			unmatched = append(unmatched, name)
			delete(excluded, name)
		}
	}
	return results, unmatched
}

// serveReadyz answers /readyz as controller-runtime's healthz does: "ok"
// and 200 when every check passes; with ?verbose, a line for each check
// ("[+]database ok") and "readyz check passed"; when one fails, 500 and
// every line ("[-]sessions failed: reason"), then "readyz check failed".
// ?exclude=NAME (repeatable) leaves a check out.
func (r *readiness) serveReadyz(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	results, unmatched := r.run(req, q["exclude"])
	var out strings.Builder
	failed := false
	for _, res := range results {
		if res.err != nil {
			failed = true
			fmt.Fprintf(&out, "[-]%s failed: %s\n", res.name, untrusted.Line(res.err.Error(), maxReasonBytes))
		} else {
			fmt.Fprintf(&out, "[+]%s ok\n", res.name)
		}
	}
	if len(unmatched) > 0 {
		fmt.Fprintf(&out, "warn: some readyz checks cannot be excluded: no matches for %s\n", untrusted.Line(strings.Join(unmatched, ", "), maxReasonBytes))
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	switch {
	case failed:
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "%sreadyz check failed\n", out.String())
	case q.Has("verbose"):
		fmt.Fprintf(w, "%sreadyz check passed\n", out.String())
	default:
		fmt.Fprint(w, "ok")
	}
}

// serveCheck answers /readyz/NAME: that one check's outcome, "ok" or 500
// with its reason, as controller-runtime's per-check paths do.
func (r *readiness) serveCheck(w http.ResponseWriter, req *http.Request) {
	name := req.PathValue("name")
	if !slices.ContainsFunc(r.checks, func(c readyzCheck) bool { return c.name == name }) {
		http.NotFound(w, req)
		return
	}
	var exclude []string
	for _, c := range r.checks {
		if c.name != name {
			exclude = append(exclude, c.name)
		}
	}
	results, _ := r.run(req, exclude)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := results[0].err; err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "[-]%s failed: %s\n", name, untrusted.Line(err.Error(), maxReasonBytes))
		return
	}
	fmt.Fprint(w, "ok")
}

// newHandler serves the metrics of reg and the probes.
func newHandler(reg prometheus.Gatherer, ready *readiness, status *statusPage, statusToken string) http.Handler {
	mux := http.NewServeMux()
	status.register(mux, statusToken)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// /healthz answers as long as the process serves HTTP at all: a
	// database outage must not make an orchestrator restart every replica.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	// /readyz says whether this replica is doing its job right now.
	mux.HandleFunc("GET /readyz", ready.serveReadyz)
	mux.HandleFunc("GET /readyz/{name}", ready.serveCheck)
	return mux
}

// Limits of the -listen server.
const (
	// maxHeaderBytes bounds a request's headers: probes, scrapes and
	// browsers send well under 8 KiB.
	maxHeaderBytes = 16 << 10
	// maxHTTPConnections bounds concurrent connections (beyond it, a few
	// for the probes only: httpConnLimits): Prometheus, the probes and a
	// few operators need a handful.
	maxHTTPConnections = 256
)

// requireToken serves h only to requests that carry token, as a bearer
// token or as the password of HTTP Basic authentication (which browsers
// prompt for); others get 401. An empty token lets every request through.
func requireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var got string
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			got = bearer
		} else if _, password, ok := r.BasicAuth(); ok {
			got = password
		}
		if subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="shepherd status"`)
			http.Error(w, "the status page needs the token of -status_token_file", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// httpServer is the -listen server, a Runnable.
type httpServer struct {
	srv *http.Server
	ln  net.Listener
}

// listenHTTP listens on addr (a port of 0 picks a free one, logged) and
// returns the server of h, which Start serves; the listener's metrics go
// to reg.
func listenHTTP(ctx context.Context, addr string, reg prometheus.Registerer, h http.Handler) (*httpServer, error) {
	limited := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shepherd_http_connections_limited_total",
		Help: "Connections to -listen the connection limits acted on: closed_idle (an idle keep-alive closed to make room), probe_only (admitted to the probes' reserve), refused (closed at once, no room).",
	}, []string{"action"})
	for _, a := range []string{limitClosedIdle, limitProbeOnly, limitRefused} {
		limited.WithLabelValues(a)
	}
	if err := reg.Register(limited); err != nil {
		return nil, fmt.Errorf("registering the -listen metrics: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-listen %s: %w", addr, err)
	}
	// Bounded in every dimension a client controls: a client trickling
	// headers, sending a slow body, holding idle keep-alives or opening
	// thousands of connections costs a bounded amount of memory and no
	// goroutine forever, and cannot keep the probes from being answered
	// (package connlimit).
	ll := newLimitListener(l, httpConnLimits(), limited)
	srv := &http.Server{
		Handler:           probeOnlyGuard(h),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         connlimit.StateHook(ll, http.StateActive, http.StateIdle),
		ConnContext:       connContext,
	}
	klog.FromContext(ctx).Info("Serving /metrics, /healthz and /readyz", "url", "http://"+ll.Addr().String())
	return &httpServer{srv: srv, ln: ll}, nil
}

// addr is the address the server listens on.
func (s *httpServer) addr() string { return s.ln.Addr().String() }

// Start serves until ctx is done, then shuts the server down.
func (s *httpServer) Start(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- s.srv.Serve(s.ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("HTTP server stopped: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(shutdownCtx)
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("HTTP server stopped: %w", err)
	}
	return nil
}

// agentEndpoint is the agents' heartbeat endpoint (-agent_listen): its own
// listener, apart from -listen, since machines reach it and operators'
// scrapers reach the other. It is a Runnable, which serves once serve has
// given it the database.
type agentEndpoint struct {
	ln                net.Listener
	certFile, keyFile string
	server            chan *heartbeat.Server
	serving           atomic.Bool
}

// listenAgents binds the heartbeat endpoint's address, so that an address
// in use fails the start at once.
func listenAgents(ctx context.Context, addr, certFile, keyFile string) (*agentEndpoint, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-agent_listen %s: %w", addr, err)
	}
	scheme := "http"
	if certFile != "" {
		scheme = "https"
	}
	klog.FromContext(ctx).Info("Serving agent heartbeats", "url", scheme+"://"+ln.Addr().String()+heartbeat.Path)
	return &agentEndpoint{ln: ln, certFile: certFile, keyFile: keyFile, server: make(chan *heartbeat.Server, 1)}, nil
}

// port is the port the endpoint listens on.
func (e *agentEndpoint) port() string {
	_, port, _ := net.SplitHostPort(e.ln.Addr().String())
	return port
}

// serve makes Start serve heartbeats, recorded in db.
func (e *agentEndpoint) serve(db *bmdb.DB, opts heartbeat.Options) {
	e.serving.Store(true)
	e.server <- heartbeat.New(db, opts)
}

// Start serves heartbeats from when serve is called until ctx is done. A
// daemon stopped before then closes the listener. The endpoint failing
// stops the daemon: a replica whose agents cannot report would have
// Recovery reboot healthy machines.
func (e *agentEndpoint) Start(ctx context.Context) error {
	var srv *heartbeat.Server
	select {
	case srv = <-e.server:
	case <-ctx.Done():
		e.ln.Close()
		return nil
	}
	preloadCtx, stopPreload := context.WithCancel(ctx)
	preloaded := make(chan struct{})
	go func() {
		defer close(preloaded)
		preloadKeys(preloadCtx, srv)
	}()
	err := srv.Serve(ctx, e.ln, e.certFile, e.keyFile)
	stopPreload()
	<-preloaded
	e.serving.Store(false)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("agent heartbeats are no longer served: %w", err)
	}
	return nil
}

// preloadKeys fills the endpoint's key cache with the fleet's agent keys
// while it serves (heartbeat.Server.Preload), so that a replica started
// under a large fleet does not read a key for each agent's first
// heartbeat. A failure leaves the keys to be read as heartbeats need them.
func preloadKeys(ctx context.Context, srv *heartbeat.Server) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	n, err := srv.Preload(ctx)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		logger.Error(err, "Preloading agent keys failed; they are read as heartbeats need them", "cached", n)
	default:
		logger.Info("Agent keys preloaded", "cached", n, "took", time.Since(start).Round(time.Millisecond))
	}
}

// check is a readiness check: the endpoint must be serving.
func (e *agentEndpoint) check(*http.Request) error {
	if e.serving.Load() {
		return nil
	}
	return errors.New("the heartbeat endpoint is not serving")
}

// derivedHeartbeatURL is the URL of the heartbeat endpoint listening at
// listen, on the port it bound, or "" when listen names no host (or every
// address), which says nothing of the address machines reach.
func derivedHeartbeatURL(listen string, tls bool, port string) string {
	host, _, err := net.SplitHostPort(listen)
	if ip, perr := netip.ParseAddr(host); err != nil || host == "" || (perr == nil && ip.IsUnspecified()) {
		return ""
	}
	return heartbeatURL(tls, net.JoinHostPort(host, port))
}

// heartbeatURL is the URL of the heartbeat endpoint at hostPort.
func heartbeatURL(tls bool, hostPort string) string {
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + hostPort + heartbeat.Path
}

// statusURL is the address an operator on this machine opens for the
// status page served on the -listen address addr.
func statusURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/status"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/status"
}

// loopbackOnly reports whether the listen address addr (host:port, as
// bound) is reachable from this host only: a loopback IP. An unspecified
// address (":9120", "0.0.0.0", "::") or any other is reachable from
// elsewhere.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
