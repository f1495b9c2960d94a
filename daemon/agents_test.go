package daemon

import (
	"context"
	"testing"

	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// The heartbeat endpoint's readiness check fails until it serves and once
// it stopped serving, and an endpoint whose listener fails under it stops
// the daemon with the error (Start returns it) rather than leaving a
// replica whose agents cannot report.
func TestAgentEndpointReadiness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, err := listenAgents(ctx, "127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.check(nil); err == nil {
		t.Error("ready before serving")
	}
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	e.serve(bmdbtest.NewDB(t, bmdb.Options{}), heartbeat.Options{})
	if err := e.check(nil); err != nil {
		t.Errorf("not ready while serving: %v", err)
	}
	e.ln.Close() // the listener fails under the server
	if err := <-done; err == nil {
		t.Error("Start returned nil after its listener failed")
	}
	if err := e.check(nil); err == nil || err.Error() != "the heartbeat endpoint is not serving" {
		t.Errorf("check after the failure: %v, want the heartbeat endpoint is not serving", err)
	}
}

// An endpoint the daemon stops before it served closes its listener.
func TestAgentEndpointStoppedBeforeServing(t *testing.T) {
	t.Parallel()
	e, err := listenAgents(context.Background(), "127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ln.Accept(); err == nil {
		t.Error("the listener still accepts")
	}
}
