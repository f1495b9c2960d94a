package redfish

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// Inspect reads what a reset would find, sends nothing, and classifies
// what would make a reset fail: the TLS certificate, the credentials
// (after one failed request) and a reset type not offered (naming the
// offers, with the Inspection still filled in).
func TestInspect(t *testing.T) {
	c := New(DefaultConfig())
	ctx := context.Background()

	srv := redfishtest.Start(t, redfishtest.Options{TLS: true, PowerState: "Off"})
	srv.SetFirmware("2.3.4", "7.10.30.00")
	dir := t.TempDir()
	good := Target{Endpoint: srv.URL, CredentialsFile: srv.WriteCredentials(t, dir), CAFile: srv.WriteCAFile(t, dir), SystemID: "Test System"}
	in, err := c.Inspect(ctx, good)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if in.SystemID != "1" || in.PowerState != "Off" || in.ResetType != DefaultResetType || in.Firmware != "BMC 7.10.30.00" ||
		strings.Join(in.Offered, ",") != "On,ForceOff,ForceRestart,GracefulRestart,PowerCycle" {
		t.Errorf("Inspect = %+v", in)
	}
	srv.SetFirmware("2.3.4", "")
	if in, err := c.Inspect(ctx, good); err != nil || in.Firmware != "BIOS 2.3.4" {
		t.Errorf("Inspect without a Manager: firmware %q, %v; want the BIOS version", in.Firmware, err)
	}

	noCA := good
	noCA.CAFile = ""
	if _, err := c.Inspect(ctx, noCA); bmcerr.Of(err) != bmcerr.TLS {
		t.Errorf("Inspect without the CA: %v (class %q), want tls", err, bmcerr.Of(err))
	}

	wrong := good
	wrong.CredentialsFile = filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong.CredentialsFile, []byte("admin:wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := len(srv.Requests())
	if _, err := c.Inspect(ctx, wrong); bmcerr.Of(err) != bmcerr.Credentials {
		t.Errorf("Inspect with a wrong password: %v (class %q), want credentials", err, bmcerr.Of(err))
	}
	failed := 0
	for _, r := range srv.Requests()[before:] {
		if r.Status == 401 {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("Inspect with a wrong password: %d failed requests, want 1", failed)
	}

	noCycle := redfishtest.Start(t, redfishtest.Options{AllowedResetTypes: []string{"On", "ForceRestart"}})
	cycle := Target{Endpoint: noCycle.URL, AllowHTTP: true, CredentialsFile: noCycle.WriteCredentials(t, t.TempDir()), ResetType: "PowerCycle"}
	in, err = c.Inspect(ctx, cycle)
	if bmcerr.Of(err) != bmcerr.Configuration || !strings.Contains(err.Error(), `it offers "On", "ForceRestart"`) ||
		in.PowerState != "On" || strings.Join(in.Offered, ",") != "On,ForceRestart" {
		t.Errorf("Inspect of a PowerCycle not offered: %+v, %v", in, err)
	}
	for _, s := range []*redfishtest.Server{srv, noCycle} {
		if r := s.Resets(); len(r) != 0 {
			t.Errorf("Inspect sent resets: %v", r)
		}
	}
}
