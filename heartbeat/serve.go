package heartbeat

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
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
	ln = netutil.LimitListener(newSourceConnLimiter(ln, s.opts.MaxConnsPerSource, s.opts.Metrics, &s.connLog), s.opts.MaxConns)
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
	}
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
