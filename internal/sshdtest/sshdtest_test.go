package sshdtest

import (
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

func dial(s *Server, hostKey ssh.PublicKey) (*ssh.Client, error) {
	return ssh.Dial("tcp", s.Addr, &ssh.ClientConfig{
		User:            s.User,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(s.ClientSigner)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
	})
}

func TestServerRunsCommandsAndRotatesHostKey(t *testing.T) {
	s := Start(t)
	first := s.HostKey()
	c, err := dial(s, first)
	if err != nil {
		t.Fatalf("dial: %v\n%s", err, s.Log())
	}
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.Output("echo hello from sshd")
	if err != nil || strings.TrimSpace(string(out)) != "hello from sshd" {
		t.Fatalf("Output = %q, %v", out, err)
	}
	c.Close()

	s.RotateHostKey(t)
	if _, err := dial(s, first); err == nil || !strings.Contains(err.Error(), "host key mismatch") {
		t.Fatalf("dial with the old host key: err = %v, want a mismatch", err)
	}
	c, err = dial(s, s.HostKey())
	if err != nil {
		t.Fatalf("dial with the new host key: %v", err)
	}
	c.Close()
}
