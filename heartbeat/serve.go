package heartbeat

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/internal/connlimit"
)

// ListenAndServe listens on addr and serves the endpoint until ctx is done,
// then shuts down gracefully. With certFile and keyFile (PEM) it serves
// HTTPS; with neither, plain HTTP, which is acceptable because heartbeats
// are signed and carry no secret (it leaks only which machines are alive).
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
//
// Serve answers as Handler does, through fasthttp rather than net/http:
// an agent sends one small request at a time on a connection it keeps,
// and net/http's work around each request (a goroutine reading ahead to
// notice a client gone, the deadlines it sets and clears for it, the
// request's allocations) cost the endpoint more CPU than the handler's
// own checks. A client hanging up is noticed when the answer is written.
func (s *Server) Serve(ctx context.Context, ln net.Listener, certFile, keyFile string) error {
	if (certFile == "") != (keyFile == "") {
		ln.Close()
		return errors.New("heartbeat endpoint: give both a certificate and a key file, or neither")
	}
	logger := klog.FromContext(ctx)
	limited := s.limitConns(ln, logger)
	s.conns.Store(limited)
	base := context.WithoutCancel(ctx)
	srv := &fasthttp.Server{
		Handler:      s.fastHandler(base),
		ErrorHandler: s.fastError(base),
		// Tight limits: legitimate requests are tiny and agents are close,
		// and a slow client must not hold connections. ReadTimeout bounds
		// a new connection's TLS handshake and first request together,
		// and every later request from its first byte.
		ReadTimeout:  5 * time.Second,
		WriteTimeout: 15 * time.Second,
		IdleTimeout:  s.opts.IdleTimeout,
		// The read buffer bounds a request's header.
		ReadBufferSize:     8 << 10,
		MaxRequestBodySize: agentproto.MaxHeartbeatSize,
		// A heartbeat is JSON: no multipart form is parsed, whatever
		// the request says its body is.
		DisablePreParseMultipartForm: true,
		TLSConfig:                    &tls.Config{MinVersion: tls.VersionTLS12},
		ConnState:                    connlimit.StateHook(limited, fasthttp.StateActive, fasthttp.StateIdle),
		// Every failed TLS handshake and broken connection would be a
		// line: anyone who reaches the port could fill the log.
		Logger:                &logWriter{msg: "Heartbeat connection failed", logger: logger},
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
	}
	errc := make(chan error, 1)
	go func() {
		if certFile != "" {
			errc <- srv.ServeTLS(limited, certFile, keyFile)
		} else {
			errc <- srv.Serve(limited)
		}
	}()
	select {
	case err := <-errc:
		limited.Close()
		return fmt.Errorf("heartbeat endpoint: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.ShutdownWithContext(shutdownCtx); err != nil {
		return fmt.Errorf("heartbeat endpoint: shutting down: %w", err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("heartbeat endpoint: %w", err)
	}
	return nil
}

// fastHandler is Serve's request handler: POST Path, as Handler's. ctx
// is Serve's, for the logger; it is not cancelled when Serve's is, so that
// requests in flight finish during the shutdown.
func (s *Server) fastHandler(ctx context.Context) fasthttp.RequestHandler {
	return func(c *fasthttp.RequestCtx) {
		// net/http recovers a handler's panic; fasthttp does not, and
		// one request must not take the daemon down.
		defer func() {
			if p := recover(); p != nil {
				s.errLog.log(klog.FromContext(ctx), "Heartbeat handler failed", fmt.Errorf("panic: %v", p))
				c.Response.Reset()
				c.SetConnectionClose()
				plainAnswer(c, http.StatusInternalServerError, "internal error")
			}
		}()
		if string(c.Path()) != Path {
			plainAnswer(c, http.StatusNotFound, "404 page not found")
			return
		}
		var result, reason string
		var status int
		if !c.IsPost() {
			c.Response.Header.Set("Allow", http.MethodPost)
			result, status, reason = ResultBadRequest, http.StatusMethodNotAllowed, notPosted
		} else {
			result, status, reason = s.handle(ctx, c.PostBody(), func() string { return s.fastSourceKey(c) })
		}
		s.counted(ctx, result, c.RemoteAddr(), reason)
		writeFast(c, result, status, reason)
	}
}

// fastError answers the requests fasthttp refuses before the handler: a
// body over agentproto.MaxHeartbeatSize is counted and answered as
// Handler answers it; a malformed request is not counted, as net/http
// does not pass one to a handler either.
func (s *Server) fastError(ctx context.Context) func(*fasthttp.RequestCtx, error) {
	return func(c *fasthttp.RequestCtx, err error) {
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			s.counted(ctx, ResultBadRequest, c.RemoteAddr(), bodyTooLarge)
			writeFast(c, ResultBadRequest, http.StatusRequestEntityTooLarge, bodyTooLarge)
			return
		}
		var small *fasthttp.ErrSmallBuffer
		var netErr net.Error
		switch {
		case errors.As(err, &small):
			plainAnswer(c, http.StatusRequestHeaderFieldsTooLarge, "request header too large")
		case errors.As(err, &netErr) && netErr.Timeout():
			plainAnswer(c, http.StatusRequestTimeout, "request timeout")
		default:
			plainAnswer(c, http.StatusBadRequest, "malformed request")
		}
	}
}

// plainAnswer answers with status and msg, as ServeHTTP does.
func plainAnswer(c *fasthttp.RequestCtx, status int, msg string) {
	c.SetStatusCode(status)
	c.Response.Header.Set("Content-Type", "text/plain; charset=utf-8")
	c.Response.Header.Set("X-Content-Type-Options", "nosniff")
	c.SetBodyString(msg + "\n")
}

// writeFast writes handle's answer as ServeHTTP does.
func writeFast(c *fasthttp.RequestCtx, result string, status int, reason string) {
	if status == http.StatusNoContent {
		c.SetStatusCode(status)
		return
	}
	if status == http.StatusTooManyRequests {
		c.Response.Header.Set("Retry-After", "1")
	}
	plainAnswer(c, status, result+": "+reason)
}

// fastSourceKey is Options.SourceKey of a request Serve received: the
// default key from the remote address at once, a key of the caller's from
// the request converted to net/http's form, which the caller's function
// takes.
func (s *Server) fastSourceKey(c *fasthttp.RequestCtx) string {
	if s.opts.SourceKey == nil {
		return connlimit.Source(c.RemoteAddr().String())
	}
	var r http.Request
	if err := fasthttpadaptor.ConvertRequest(c, &r, true); err != nil {
		return connlimit.Source(c.RemoteAddr().String())
	}
	return s.opts.SourceKey(&r)
}

// logWriter is the servers' error log: a line a failed connection, at most
// one every 10 seconds (rateLimitedLog).
type logWriter struct {
	msg    string
	log    rateLimitedLog
	logger klog.Logger // Serve's
}

// Printf is fasthttp.Logger's method.
func (w *logWriter) Printf(format string, args ...any) {
	w.log.log(w.logger, w.msg, errors.New(strings.TrimSpace(fmt.Sprintf(format, args...))))
}
