package redfish

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
)

func TestResetDefaultsToForceRestart(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{})
	dir := t.TempDir()
	c := New(DefaultConfig())
	err := c.Reset(context.Background(), Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, dir), AllowHTTP: true})
	if err != nil {
		t.Fatalf("Reset: %v", err)
	}
	resets := srv.Resets()
	if len(resets) != 1 || resets[0].ResetType != "ForceRestart" || resets[0].SystemID != "1" {
		t.Fatalf("resets = %+v, want one ForceRestart of system 1", resets)
	}
	var sawReset bool
	for _, r := range srv.Requests() {
		if r.Path != "/redfish/v1/" && !r.Authorized {
			t.Errorf("request %s %s without the right credentials", r.Method, r.Path)
		}
		sawReset = sawReset || (r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/Actions/ComputerSystem.Reset"))
	}
	if !sawReset {
		t.Errorf("no POST to the Reset action in %+v", srv.Requests())
	}
}

func TestResetConfiguredTypeSystemAndTLS(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{TLS: true, SystemID: "System.Embedded.1"})
	dir := t.TempDir()
	creds := srv.WriteCredentials(t, dir)
	c := New(DefaultConfig())

	// Without the CA the certificate is refused: no option skips that.
	err := c.Reset(context.Background(), Target{Endpoint: srv.URL, CredentialsFile: creds})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Reset without CA file: err = %v, want a certificate error", err)
	}
	target := Target{
		Endpoint:        srv.URL,
		CredentialsFile: creds,
		CAFile:          srv.WriteCAFile(t, dir),
		SystemID:        "System.Embedded.1",
		ResetType:       "GracefulRestart",
	}
	if err := c.Reset(context.Background(), target); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if r := srv.Resets(); len(r) != 1 || r[0].ResetType != "GracefulRestart" {
		t.Fatalf("resets = %+v, want one GracefulRestart", r)
	}

	target.SystemID = "nope"
	err = c.Reset(context.Background(), target)
	if err == nil || !strings.Contains(err.Error(), `no system "nope"`) {
		t.Fatalf("Reset of unknown system: err = %v", err)
	}
}

func TestResetWrongCredentialsNeverLeaks(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{})
	p := filepath.Join(t.TempDir(), "creds.json")
	const secret = "wrong-but-secret-password"
	if err := os.WriteFile(p, []byte(`{"username": "admin", "password": "`+secret+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	err := New(DefaultConfig()).Reset(context.Background(), Target{Endpoint: srv.URL, CredentialsFile: p, AllowHTTP: true})
	if err == nil {
		t.Fatal("Reset with wrong credentials succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error leaks the password: %v", err)
	}
	if r := srv.Resets(); len(r) != 0 {
		t.Fatalf("resets = %+v, want none", r)
	}
}

func TestResetTimesOut(t *testing.T) {
	block := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(block)
	creds := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(creds, []byte("u:p"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := New(Config{Timeout: 300 * time.Millisecond}).Reset(context.Background(), Target{Endpoint: hang.URL, CredentialsFile: creds, AllowHTTP: true})
	if err == nil || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Reset took %s with a 300ms timeout", d)
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "https://10.0.0.1", want: "https://10.0.0.1"},
		{in: "https://bmc.example:8443/", want: "https://bmc.example:8443"},
		{in: "http://[fd00::1]:80", want: "http://[fd00::1]:80"},
		{in: "https://root:hunter2@bmc", err: "credentials in the URL"},
		{in: "ftp://bmc", err: "http or https"},
		{in: "bmc.example", err: "http or https"},
		{in: "https://", err: "no host"},
		{in: "https://bmc/redfish/v1", err: "without a path"},
		{in: "https://bmc?x=1", err: "query"},
		{in: "https://bmc:0", err: "port"},
		{in: "https://bmc:99999", err: "port"},
	} {
		got, err := ParseEndpoint(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseEndpoint(%q) = %q, %v; want error containing %q", tc.in, got, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("ParseEndpoint(%q) error leaks the password: %v", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// PowerState reads the system's PowerState, and PowerOn posts the Reset
// action with On, which powers a system that is off on.
func TestPowerStateAndPowerOn(t *testing.T) {
	srv := redfishtest.Start(t, redfishtest.Options{PowerState: "Off"})
	c := New(DefaultConfig())
	target := Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, t.TempDir()), AllowHTTP: true}
	ctx := context.Background()
	if state, err := c.PowerState(ctx, target); err != nil || state != PowerStateOff {
		t.Fatalf("PowerState = %q, %v; want Off", state, err)
	}
	if err := c.PowerOn(ctx, target); err != nil {
		t.Fatalf("PowerOn: %v", err)
	}
	if resets := srv.Resets(); len(resets) != 1 || resets[0].ResetType != "On" {
		t.Fatalf("resets = %+v, want one On", resets)
	}
	if state, err := c.PowerState(ctx, target); err != nil || state != PowerStateOn {
		t.Fatalf("PowerState after PowerOn = %q, %v; want On", state, err)
	}
	srv.SetPowerState("PoweringOn")
	if state, err := c.PowerState(ctx, target); err != nil || state != "PoweringOn" {
		t.Fatalf("PowerState = %q, %v; want PoweringOn as the BMC said it", state, err)
	}
}
