package redfish

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// wrongCredentials writes credentials the test server refuses.
func wrongCredentials(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "wrong-creds")
	if err := os.WriteFile(p, []byte("admin:wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// refused counts the requests the server answered 401.
func refused(srv *redfishtest.Server) int {
	n := 0
	for _, r := range srv.Requests() {
		if r.Status == http.StatusUnauthorized {
			n++
		}
	}
	return n
}

// A wrong password costs exactly one refused request per attempt, with or
// without a system_id, and the error says the credentials were refused.
func TestWrongPasswordOneRequestPerAttempt(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{})
	c := New(DefaultConfig())
	ctx := context.Background()
	creds := wrongCredentials(t)
	for i, target := range []Target{
		{Endpoint: srv.URL, CredentialsFile: creds, AllowHTTP: true, SystemID: "1"},
		{Endpoint: srv.URL, CredentialsFile: creds, AllowHTTP: true},
		{Endpoint: srv.URL, CredentialsFile: creds, AllowHTTP: true, SystemID: "nope"},
	} {
		err := c.Reset(ctx, target)
		if bmcerr.Of(err) != bmcerr.Credentials || !strings.Contains(err.Error(), "BMC refused the credentials (401)") {
			t.Fatalf("Reset %d: err = %v (class %q), want the credentials refused (401)", i, err, bmcerr.Of(err))
		}
		if n := refused(srv); n != i+1 {
			t.Fatalf("after attempt %d: %d requests refused, want %d: %+v", i+1, n, i+1, srv.Requests())
		}
	}
	if _, err := c.PowerState(ctx, Target{Endpoint: srv.URL, CredentialsFile: creds, AllowHTTP: true, SystemID: "1"}); bmcerr.Of(err) != bmcerr.Credentials {
		t.Fatalf("PowerState: err = %v, want the credentials refused", err)
	}
	if n := refused(srv); n != 4 {
		t.Fatalf("after the power read: %d requests refused, want 4", n)
	}
}

// A system_id given as the system's Name resolves, whether the BMC
// redirects /Systems/<Name> to /Systems/<UUID> (as sushy-tools does) or
// answers 404 and the Name is found in the collection.
func TestSystemByName(t *testing.T) {
	const uuid = "2d9a9c3e-4b6f-4ad1-9a63-0c6f1b0e7a11"
	for _, redirect := range []bool{true, false} {
		srv := redfishtest.Start(t, redfishtest.Options{SystemID: uuid, SystemName: "node-7", RedirectName: redirect})
		target := Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, t.TempDir()), AllowHTTP: true, SystemID: "node-7"}
		if err := New(DefaultConfig()).Reset(context.Background(), target); err != nil {
			t.Fatalf("redirect %v: Reset: %v", redirect, err)
		}
		if r := srv.Resets(); len(r) != 1 || r[0].SystemID != uuid {
			t.Fatalf("redirect %v: resets = %+v, want one of system %s", redirect, r, uuid)
		}
		saw307 := false
		for _, r := range srv.Requests() {
			saw307 = saw307 || r.Status == http.StatusTemporaryRedirect
		}
		if saw307 != redirect {
			t.Fatalf("redirect %v: requests %+v", redirect, srv.Requests())
		}
	}
}

// A reset type the system does not offer is refused before anything is
// sent, as a configuration error that lists the offers and names the
// replacement to configure.
func TestResetTypeNotOffered(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{AllowedResetTypes: []string{"On", "ForceOff", "GracefulRestart", "ForceRestart"}})
	target := Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, t.TempDir()), AllowHTTP: true, ResetType: "PowerCycle"}
	err := New(DefaultConfig()).Reset(context.Background(), target)
	if bmcerr.Of(err) != bmcerr.Configuration {
		t.Fatalf("err = %v (class %q), want a configuration error", err, bmcerr.Of(err))

	}
	for _, want := range []string{"BMC configuration error: resetting system", `"PowerCycle" is not offered`, `"GracefulRestart"`, `"ForceRestart"`, "set redfish.reset_type: ForceRestart"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to say %s", err, want)
		}
	}
	for _, r := range srv.Requests() {
		if r.Method == http.MethodPost {
			t.Fatalf("a reset was posted: %+v", srv.Requests())
		}
	}
}

// A BMC answering 409 is busy.
func TestBusyBMC(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{})
	srv.SetBusy(true)
	target := Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, t.TempDir()), AllowHTTP: true}
	_, err := New(DefaultConfig()).PowerState(context.Background(), target)
	if bmcerr.Of(err) != bmcerr.Busy || !strings.Contains(err.Error(), "BMC busy (409)") {
		t.Fatalf("err = %v (class %q), want busy (409)", err, bmcerr.Of(err))
	}
}

// A BMC that refuses the connection is unreachable; one whose certificate
// is not signed by a known CA is a TLS error.
func TestUnreachableAndTLS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	c := New(DefaultConfig())
	ctx := context.Background()
	_, err = c.PowerState(ctx, Target{Endpoint: closed, CredentialsFile: credsFile(t), AllowHTTP: true})
	if bmcerr.Of(err) != bmcerr.Unreachable || !strings.HasPrefix(err.Error(), "BMC unreachable: ") {
		t.Fatalf("closed port: err = %v (class %q), want unreachable", err, bmcerr.Of(err))
	}

	srv := redfishtest.Start(t, redfishtest.Options{TLS: true})
	err = c.Reset(ctx, Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, t.TempDir())})
	if bmcerr.Of(err) != bmcerr.TLS || !strings.Contains(err.Error(), "TLS certificate not verified") {
		t.Fatalf("unknown CA: err = %v (class %q), want TLS", err, bmcerr.Of(err))
	}
}

// A BMC that accepts the connection and never answers is unreachable
// once the action's timeout passes.
func TestSilentBMCUnreachable(t *testing.T) {
	block := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(block)
	_, err := New(Config{Timeout: 300 * time.Millisecond}).PowerState(context.Background(), Target{Endpoint: hang.URL, CredentialsFile: credsFile(t), AllowHTTP: true})
	if bmcerr.Of(err) != bmcerr.Unreachable {
		t.Fatalf("err = %v (class %q), want unreachable", err, bmcerr.Of(err))
	}
}
