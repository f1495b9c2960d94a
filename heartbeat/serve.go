package heartbeat

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// ListenAndServe listens on addr and serves Handler until ctx is done, then
// shuts down gracefully. With certFile and keyFile (PEM) it serves HTTPS;
// with neither, plain HTTP, which is acceptable because heartbeats are
// signed and carry no secret (it leaks only which machines are alive).
func (s *Server) ListenAndServe(ctx context.Context, addr, certFile, keyFile string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("heartbeat endpoint: %w", err)
	}
	return s.Serve(ctx, ln, certFile, keyFile)
}

// Serve is ListenAndServe on an existing listener, which it closes. Callers
// that need the bound address (a :0 port) listen themselves. The
// connections it serves are bounded by Options.MaxConns,
// MaxConnsPerSource and IdleTimeout.
func (s *Server) Serve(ctx context.Context, ln net.Listener, certFile, keyFile string) error {
	if (certFile == "") != (keyFile == "") {
		ln.Close()
		return errors.New("heartbeat endpoint: give both a certificate and a key file, or neither")
	}
	logger := klog.FromContext(ctx)
	limited := newConnLimiter(ln, s.opts.MaxConns, s.opts.MaxConnsPerSource, s.opts.Metrics, &s.connLog, logger)
	s.conns.Store(limited)
	srv := &http.Server{
		Handler: s.Handler(),
		// Tight limits: legitimate requests are tiny and agents are close,
		// and a slow client must not hold connections.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    8 << 10,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12},
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ConnState:         limited.trackConnState,
		// HTTP/1.1 only: the limiter learns from ConnState which
		// connections carry a request, which HTTP/2 connections do not
		// report, and agents send one small request at a time.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		// Every failed TLS handshake and broken connection would be a
		// line: anyone who reaches the port could fill the log.
		ErrorLog: log.New(&logWriter{msg: "Heartbeat connection failed", logger: logger}, "", 0),
	}
	ln = limited
	errc := make(chan error, 1)
	go func() {
		if certFile != "" {
			errc <- srv.ServeTLS(ln, certFile, keyFile)
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("heartbeat endpoint: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("heartbeat endpoint: shutting down: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("heartbeat endpoint: %w", err)
	}
	return nil
}

// logWriter is an http.Server's ErrorLog: a line a connection, at most one
// every 10 seconds (rateLimitedLog).
type logWriter struct {
	msg    string
	log    rateLimitedLog
	logger klog.Logger // Serve's
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.log.log(w.logger, w.msg, errors.New(strings.TrimSpace(string(p))))
	return len(p), nil
}
