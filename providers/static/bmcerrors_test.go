package static

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// A BMC failure counts in shepherd_bmc_errors_total under its class: a
// busy BMC as busy, a refused password as credentials.
func TestBMCErrorsCountedByClass(t *testing.T) {
	db := openDB(t)
	bmc := redfishtest.Start(t, redfishtest.Options{})
	dir := t.TempDir()
	creds := bmc.WriteCredentials(t, dir)
	file := filepath.Join(dir, "inventory.yaml")
	writeFiles(t, dir, map[string]string{"inventory.yaml": `
- id: a
  ssh: {address: 10.0.0.1, user: root}
  redfish: {endpoint: ` + bmc.URL + `, allow_http: true, credentials_file: ` + filepath.Base(creds) + `}
- id: b
  ssh: {address: 10.0.0.2, user: root}
  redfish: {endpoint: ` + bmc.URL + `, allow_http: true, credentials_file: wrong}
`, "wrong": "admin:wrong\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := New(ctx, testConfig(t, file), db.Public(), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	machines := provided(t, db)
	bmc.SetBusy(true)
	if _, err := p.PowerState(ctx, machines["a"]); bmcerr.Of(err) != bmcerr.Busy {
		t.Fatalf("PowerState of a busy BMC: %v", err)
	}
	bmc.SetBusy(false)
	if err := p.Reboot(ctx, machines["b"]); bmcerr.Of(err) != bmcerr.Credentials {
		t.Fatalf("Reboot with a wrong password: %v", err)
	}
	for class, want := range map[bmcerr.Class]float64{bmcerr.Busy: 1, bmcerr.Credentials: 1, bmcerr.Unreachable: 0} {
		if got := value(t, p.metrics.bmcErrors.WithLabelValues(PowerRedfish, string(class))); got != want {
			t.Errorf("shepherd_bmc_errors_total{provider=redfish,class=%s} = %v, want %v", class, got, want)
		}
	}
}
