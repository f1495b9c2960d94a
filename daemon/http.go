package daemon

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// readyPingTimeout bounds the database ping of /readyz: a probe that hangs
// on a dead database would be as bad as a wrong answer.
const readyPingTimeout = time.Second

// readiness is what /readyz reports on. The daemon fills it in as it starts:
// until the loops run (database schema checked, fleet seeded), and again
// once it is stopping, the daemon is not ready.
type readiness struct {
	state atomic.Pointer[readyState]
}

type readyState struct {
	// phase is "" while running, else why the daemon is not (yet) ready.
	phase   string
	db      *bmdb.DB
	runners []*controlloop.Runner
	// checks are further conditions of readiness.
	checks []readyzCheck
}

func (r *readiness) set(phase string) { r.state.Store(&readyState{phase: phase}) }

func (r *readiness) running(db *bmdb.DB, runners []*controlloop.Runner, checks []readyzCheck) {
	r.state.Store(&readyState{db: db, runners: runners, checks: checks})
}

// check returns nil when ready, else the reasons, one per line.
func (r *readiness) check(req *http.Request) []string {
	st := r.state.Load()
	if st == nil {
		return []string{"starting"}
	}
	if st.phase != "" {
		return []string{st.phase}
	}
	var problems []string
	pingCtx, cancel := context.WithTimeout(req.Context(), readyPingTimeout)
	defer cancel()
	if err := st.db.Ping(pingCtx); err != nil {
		problems = append(problems, fmt.Sprintf("database: %v", err))
	}
	for _, rn := range st.runners {
		if !rn.Ready() {
			problems = append(problems, rn.Info().Label+": no live BMDB session")
		}
	}
	for _, c := range st.checks {
		err := c.check(req)
		switch {
		case err == nil:
		case c.name == "":
			problems = append(problems, err.Error())
		default:
			problems = append(problems, c.name+": "+err.Error())
		}
	}
	return problems
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
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		problems := ready.check(req)
		if len(problems) > 0 {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n%s\n", strings.Join(problems, "\n"))
			return
		}
		fmt.Fprintln(w, "ok")
	})
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
	// (limitListener).
	ll := newLimitListener(l, httpConnLimits(), limited)
	srv := &http.Server{
		Handler:           probeOnlyGuard(h),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         ll.trackConnState,
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
	return errors.New("heartbeat endpoint: not serving")
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
