package sshagent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shepherd-fleet/shepherd/processes/agentstart"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/sshdtest"
)

// A machine whose SSH address answers with a hostile disconnect text fails
// the attempt with an error whose text, stored as the failure's cause,
// ends the lease (PostgreSQL refuses NUL with SQLSTATE 22021 unless the
// cause is cleaned) and is clean and bounded in history.
func TestHostileSSHDisconnectText(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.target.Address = sshdtest.StartHostile(t, "go away \x00\xff\x1b[2J"+strings.Repeat("z", 64<<10))
	start := time.Now()
	_, sshErr := f.client(t).StartAgent(withTimeout(t, time.Minute), f.target)
	if sshErr == nil || !strings.Contains(sshErr.Error(), "go away") {
		t.Fatalf("StartAgent against a hostile server: %v, want its disconnect", sshErr)
	}
	if d := time.Since(start); d > 10*time.Second || errors.Is(sshErr, context.DeadlineExceeded) {
		t.Errorf("the hostile server held the attempt for %s (%v)", d, sshErr)
	}

	ctx := context.Background()
	s, err := f.db.StartSession(ctx, bmdb.SessionConfig{Component: "test", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	agentStart := bmdb.Process{Name: "ShepherdAgentStart", ExclusionGroup: "Shepherd"}
	bmdbtest.Register(t, f.db, agentStart, agentstart.Candidates())
	leases, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: agentstart.Candidates()})
	if err != nil {
		t.Fatal(err)
	}
	w := leases[0]
	if err := w.Fail(ctx, bmdb.Backoff{Initial: time.Minute}, sshErr.Error()); err != nil {
		t.Fatalf("failing with the hostile cause: %v", err)
	}
	h, err := f.db.History(ctx, f.target.Machine)
	if err != nil {
		t.Fatal(err)
	}
	var cause string
	for _, e := range h {
		if e.Event == bmdb.EventFailed {
			cause = e.Cause
		}
	}
	if !utf8.ValidString(cause) || strings.ContainsAny(cause, "\x00\x1b") || len(cause) > 4200 || !strings.Contains(cause, `\x00`) {
		t.Errorf("stored cause (%d bytes) not clean and bounded: %.200q", len(cause), cause)
	}
}
