package shepherdcli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// rawControls holds a character of each class a terminal acts on or
// reorders text by: ESC (C0), U+009B (C1, CSI on many terminals) and
// U+202E (a bidirectional override).
const rawControls = "\x1b\u009b\u202e"

// JSON output holds no C0 or C1 control or bidirectional override that
// the BMDB's strings hold, neither raw (encoding/json alone passes C1 and
// U+202E raw) nor as a JSON escape that a decoder (jq -r) turns back into
// the raw character: each string decodes to the text as the terminal
// output shows it (untrusted.Visible: ESC as the text \x1b).
func TestCLIJSONEscapesControls(t *testing.T) {
	t.Parallel()
	f := newCLIFleet(t)
	ctx := context.Background()
	hostile := bmdb.Provided{
		Provider:   "test",
		ProviderID: "rack1-\u202e70-kcar\x1b[2J",
		Address:    "192.0.2.9\u009b31m",
		Location:   "dc1\x1b]0;title\x07",
	}
	cause := "ssh: \x1b[31mred\u009b2J \u202eevil"
	err := f.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		if _, err := tx.AddMachine(ctx, hostile); err != nil {
			return err
		}
		// Causes are cleaned where Shepherd records them; one written by
		// other means (a restore, a hand edit, an older release) is not.
		_, err := tx.Exec(ctx, `UPDATE work_backoff SET cause = $1 WHERE machine_id = $2`, cause, f.failed)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	raw := func(what, out string) {
		t.Helper()
		if i := strings.IndexAny(out, rawControls); i >= 0 {
			t.Errorf("%s: a control character left raw at byte %d:\n%q", what, i, out)
		}
		var decoded any
		if err := json.Unmarshal([]byte(out), &decoded); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if s := rawString(decoded); s != "" {
			t.Errorf("%s: a string decodes to a raw control character: %q", what, s)
		}
	}

	out, _ := f.expect(t, exitOK, "machines", "-process", "agentstart", "-state", "backoff", "-o", "json")
	raw("machines -o json", out)
	var rows []machineJSON
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("machines -o json: %v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0].Cause != untrusted.Visible(cause) {
		t.Errorf("machines -o json decodes to %+v, want the cause %q", rows, untrusted.Visible(cause))
	}

	out, _ = f.expect(t, exitOK, "machines", "-all", "-o", "json")
	raw("machines -all -o json", out)
	var fleet []fleetJSON
	if err := json.Unmarshal([]byte(out), &fleet); err != nil {
		t.Fatalf("machines -all -o json: %v\n%s", err, out)
	}
	found := false
	for _, m := range fleet {
		if m.Provider == hostile.Provider && m.ProviderID == untrusted.Visible(hostile.ProviderID) {
			found = true
			if m.Address != untrusted.Visible(hostile.Address) || m.Location != untrusted.Visible(hostile.Location) {
				t.Errorf("machines -all -o json: address %q, location %q; want them escaped", m.Address, m.Location)
			}
		}
	}
	if !found {
		t.Errorf("machines -all -o json: no machine with provider id %q:\n%s", hostile.ProviderID, out)
	}
}

// rawString returns a string of the decoded JSON v holding a character of
// rawControls, "" if none does.
func rawString(v any) string {
	switch v := v.(type) {
	case string:
		if strings.ContainsAny(v, rawControls) {
			return v
		}
	case []any:
		for _, e := range v {
			if s := rawString(e); s != "" {
				return s
			}
		}
	case map[string]any:
		for _, e := range v {
			if s := rawString(e); s != "" {
				return s
			}
		}
	}
	return ""
}
