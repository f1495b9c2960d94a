package sshagent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// hostileSSHServer answers every connection with an SSH version line and
// then an SSH disconnect message whose text is hostile: a NUL, invalid
// UTF-8, a terminal escape and 64 KiB. Anything that answers on a machine's
// SSH address can send this, before any host key is verified.
func hostileSSHServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	text := "go away \x00\xff\x1b[2J" + strings.Repeat("z", 64<<10)
	var payload []byte
	payload = append(payload, 1) // SSH_MSG_DISCONNECT
	payload = binary.BigEndian.AppendUint32(payload, 2)
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(text)))
	payload = append(payload, text...)
	payload = binary.BigEndian.AppendUint32(payload, 0) // language tag
	padding := 8 - (len(payload)+5)%8
	if padding < 4 {
		padding += 8
	}
	var packet []byte
	packet = binary.BigEndian.AppendUint32(packet, uint32(1+len(payload)+padding))
	packet = append(packet, byte(padding))
	packet = append(packet, payload...)
	packet = append(packet, make([]byte, padding)...)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				c.Write([]byte("SSH-2.0-Hostile_1.0\r\n"))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				c.Write(packet)
				time.Sleep(100 * time.Millisecond) // let the client read it before the close
			}()
		}
	}()
	return l.Addr().String()
}

// A machine whose SSH address answers with a hostile disconnect text fails
// the attempt with an error whose text, stored as the failure's cause,
// ends the lease (PostgreSQL refuses NUL with SQLSTATE 22021 unless the
// cause is cleaned) and is clean and bounded in history.
func TestHostileSSHDisconnectText(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.target.Address = hostileSSHServer(t)
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
	w, err := s.Work(ctx, bmdb.Process{Name: "ShepherdAgentStart", ExclusionGroup: "Shepherd"}, bmdb.AgentStartCandidates())
	if err != nil {
		t.Fatal(err)
	}
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
