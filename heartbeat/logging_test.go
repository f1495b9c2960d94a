package heartbeat

import (
	"context"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// The endpoint logs through the logger of the context Serve is given: a
// refused heartbeat (through the request's context) and a failed TLS
// handshake (through the http.Server's error log) reach the test's
// logger, not klog's global one.
func TestServeLogsThroughItsContext(t *testing.T) {
	t.Parallel()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer()
	e := newEnv(t, Options{})
	ts, ln, certFile, keyFile := tlsListener(t)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ctx, ln, certFile, keyFile) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	if status, _ := post(t, ts.Client(), "https://"+ln.Addr().String()+Path, []byte("not a heartbeat")); status != http.StatusBadRequest {
		t.Fatalf("garbage: status %d, want %d", status, http.StatusBadRequest)
	}
	// Plain text to the TLS port: the handshake fails.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	c.Close()

	bmdbtest.WaitUntil(t, time.Minute, "the endpoint's lines in the test's logger", func() bool {
		data := logs.Data()
		has := func(msg string) bool {
			return slices.ContainsFunc(data, func(e ktesting.LogEntry) bool { return e.Message == msg })
		}
		return has("Heartbeat refused") && has("Heartbeat connection failed")
	})
}
