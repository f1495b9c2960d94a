package static

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// With -inventory_check_bmcs, Run checks the BMCs of the inventory once
// it is loaded and counts the machines whose reset would fail by class,
// acting on none.
func TestInventoryCheckBMCs(t *testing.T) {
	db := openDB(t)
	good := redfishtest.Start(t, redfishtest.Options{})
	noCycle := redfishtest.Start(t, redfishtest.Options{AllowedResetTypes: []string{"On", "ForceRestart"}})
	dir := t.TempDir()
	file := filepath.Join(dir, "inventory.yaml")
	writeFiles(t, dir, map[string]string{"inventory.yaml": `
- id: a
  ssh: {address: 10.0.0.1, user: root}
  redfish: {endpoint: ` + good.URL + `, allow_http: true, credentials_file: ` + filepath.Base(good.WriteCredentials(t, dir)) + `}
- id: b
  ssh: {address: 10.0.0.2, user: root}
  redfish: {endpoint: ` + good.URL + `, allow_http: true, credentials_file: wrong}
- id: c
  ssh: {address: 10.0.0.3, user: root}
  redfish: {endpoint: ` + noCycle.URL + `, allow_http: true, reset_type: PowerCycle, credentials_file: ` + filepath.Base(good.WriteCredentials(t, dir)) + `}
- id: d
  ssh: {address: 10.0.0.4, user: root}
`, "wrong": "admin:wrong\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t, file)
	cfg.CheckBMCs = true
	p, err := New(ctx, cfg, db.Public(), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	want := map[bmcerr.Class]float64{bmcerr.Credentials: 1, bmcerr.Configuration: 1, bmcerr.Unreachable: 0}
	bmdbtest.WaitFor(t, 30*time.Second, "the BMC check to count the failures", func() (bool, string) {
		got := map[bmcerr.Class]float64{}
		for class := range want {
			got[class] = value(t, p.metrics.bmcCheckFailures.WithLabelValues(string(class)))
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
	for _, s := range []*redfishtest.Server{good, noCycle} {
		if r := s.Resets(); len(r) != 0 {
			t.Errorf("the BMC check sent resets: %v", r)
		}
	}
}
