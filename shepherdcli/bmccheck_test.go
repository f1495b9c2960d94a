package shepherdcli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
)

// bmc check, through the binary, against the Redfish test server and
// ipmi_sim: good BMCs pass (exit 0); a wrong password is reported as
// credentials refused, after one failed request, and a PowerCycle the BMC
// does not offer is named with what it offers (exit 1); an unknown
// machine is a usage error (exit 2). No BMC is ever acted on.
func TestBMCCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rfGood := redfishtest.Start(t, redfishtest.Options{})
	rfBadPass := redfishtest.Start(t, redfishtest.Options{})
	rfNoCycle := redfishtest.Start(t, redfishtest.Options{AllowedResetTypes: []string{"On", "ForceOff", "ForceRestart"}})
	ipGood := ipmisimtest.Start(t)
	ipBadPass := ipmisimtest.Start(t)

	wrong := filepath.Join(dir, "wrong.creds")
	if err := os.WriteFile(wrong, []byte("admin:not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	power := map[string]string{
		"rf-good":     fmt.Sprintf("redfish: {endpoint: %s, allow_http: true, credentials_file: %s}", rfGood.URL, rfGood.WriteCredentials(t, t.TempDir())),
		"rf-badpass":  fmt.Sprintf("redfish: {endpoint: %s, allow_http: true, credentials_file: %s}", rfBadPass.URL, wrong),
		"rf-nocycle":  fmt.Sprintf("redfish: {endpoint: %s, allow_http: true, reset_type: PowerCycle, credentials_file: %s}", rfNoCycle.URL, rfNoCycle.WriteCredentials(t, t.TempDir())),
		"ipmi-good":   fmt.Sprintf("ipmi: {address: 127.0.0.1, port: %d, credentials_file: %s}", ipGood.Port, ipGood.WriteCredentials(t, t.TempDir(), "")),
		"ipmi-badpas": fmt.Sprintf("ipmi: {address: 127.0.0.1, port: %d, credentials_file: %s}", ipBadPass.Port, ipBadPass.WriteCredentials(t, t.TempDir(), "wrong-password")),
	}
	inventory := ""
	names := []string{"rf-good", "rf-badpass", "rf-nocycle", "ipmi-good", "ipmi-badpas"}
	for i, name := range names {
		inventory += fmt.Sprintf("- id: %s\n  location: dc1/rack%d\n  ssh: {address: 127.0.0.1, port: %d, user: root}\n  %s\n", name, i%2, 2200+i, power[name])
	}
	inv := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte(inventory), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(args ...string) (int, string, string) {
		return runShepherd(t, nil, append([]string{"bmc", "check", "-provider", "static", "-inventory", inv, "-redfish_timeout=20s", "-ipmi_timeout=20s"}, args...)...)
	}

	code, out, errOut := check("rf-good", "ipmi-good")
	if code != 0 {
		t.Fatalf("bmc check of good BMCs: exit %d, want 0\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"ForceRestart (OK)", "power_cycle (OK)", "ipmi://127.0.0.1:"} {
		if !strings.Contains(out, want) {
			t.Errorf("bmc check of good BMCs: no %q in\n%s", want, out)
		}
	}

	code, out, errOut = check("-all", "-o", "json")
	if code != 1 {
		t.Fatalf("bmc check -all: exit %d, want 1\n%s%s", code, out, errOut)
	}
	var rows []bmcCheckRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("bmc check -o json: %v\n%s", err, out)
	}
	got := map[string]bmcCheckRow{}
	for _, r := range rows {
		got[r.ProviderID] = r
	}
	for name, want := range map[string]struct{ result, power string }{
		"rf-good": {"ok", "On"}, "ipmi-good": {"ok", "On"},
		"rf-badpass": {"credentials", ""}, "ipmi-badpas": {"credentials", ""},
		"rf-nocycle": {"configuration", "On"},
	} {
		r := got[name]
		if r.Result != want.result || r.Power != want.power {
			t.Errorf("%s: result %q power %q (%s), want %q %q", name, r.Result, r.Power, r.Error, want.result, want.power)
		}
	}
	if r := got["rf-nocycle"]; r.ResetOK || r.ResetType != "PowerCycle" || strings.Join(r.Offered, ",") != "On,ForceOff,ForceRestart" {
		t.Errorf("rf-nocycle: reset type %q offered=%v, offers %v; want PowerCycle not offered, offers On,ForceOff,ForceRestart", r.ResetType, r.ResetOK, r.Offered)
	}
	if r := got["ipmi-good"]; !strings.HasPrefix(r.Firmware, "BMC ") {
		t.Errorf("ipmi-good: firmware %q, want the BMC's revision", r.Firmware)
	}

	// The table names what the BMC offers instead, and the classes.
	code, out, _ = check("-location", "dc1")
	if code != 1 || !strings.Contains(out, "PowerCycle (not offered: offers On, ForceOff, ForceRestart)") ||
		!strings.Contains(out, "credentials: BMC refused the credentials") {
		t.Errorf("bmc check -location dc1: exit %d, want 1 naming the offers and the credentials refused:\n%s", code, out)
	}

	// A wrong password costs one failed request per check.
	failed := 0
	for _, r := range rfBadPass.Requests() {
		if r.Status == 401 {
			failed++
		}
	}
	if failed != 2 { // two checks (-all, -location dc1)
		t.Errorf("wrong password: %d failed requests after two checks, want 2: %+v", failed, rfBadPass.Requests())
	}
	// Never acts.
	for name, s := range map[string]*redfishtest.Server{"rf-good": rfGood, "rf-badpass": rfBadPass, "rf-nocycle": rfNoCycle} {
		if r := s.Resets(); len(r) != 0 {
			t.Errorf("%s: bmc check sent resets %v", name, r)
		}
	}
	for name, s := range map[string]*ipmisimtest.Sim{"ipmi-good": ipGood, "ipmi-badpas": ipBadPass} {
		if log := s.Log(t); strings.Contains(log, "power") {
			t.Errorf("%s: bmc check acted on the chassis: %s", name, log)
		}
	}

	// Bad input: exit 2, one line.
	for _, args := range [][]string{
		{"rf-good", "no-such-machine"},
		{"-location", "dc9"},
		{},
		{"rf-good", "-all"},
		{"-all", "-o", "yaml"},
	} {
		code, out, errOut := check(args...)
		if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("bmc check %v: exit %d, stderr %q (stdout %q), want 2 and one line", args, code, errOut, out)
		}
	}
	if code, _, errOut := runShepherd(t, nil, "bmc", "check", "-provider", "static", "rf-good"); code != 2 || !strings.Contains(errOut, "-inventory") {
		t.Errorf("bmc check without -inventory: exit %d, %q; want 2 naming -inventory", code, errOut)
	}
	if code, _, errOut := check("no-such-machine"); !strings.Contains(errOut, "unknown machine no-such-machine") {
		t.Errorf("bmc check of an unknown machine: exit %d, %q", code, errOut)
	}

	// By UUID, through the BMDB; every row then shows its machine's UUID.
	id := uuid.New()
	if code, _, errOut := check(id.String()); code != 2 || !strings.Contains(errOut, "needs the BMDB") {
		t.Errorf("bmc check UUID without a BMDB: exit %d, %q; want 2", code, errOut)
	}
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	var good uuid.UUID
	err := db.Transact(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		good, err = tx.AddMachine(ctx, bmdb.Provided{Provider: "static", ProviderID: "rf-good", Address: "127.0.0.1:2200", Power: "redfish"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = check("-bmdb_dsn", dsn, good.String(), "ipmi-good")
	if code != 0 || !strings.Contains(out, good.String()+"  rf-good") {
		t.Errorf("bmc check by UUID: exit %d, want 0 and a row of %s rf-good:\n%s%s", code, good, out, errOut)
	}
	if code, _, errOut := check("-bmdb_dsn", dsn, id.String()); code != 2 || !strings.Contains(errOut, "unknown machine "+id.String()) {
		t.Errorf("bmc check of an unknown UUID: exit %d, %q; want 2", code, errOut)
	}
}
