package shepherdcli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// With -log_format=json every line the daemon writes is one JSON object,
// and the lines about a task carry its keys as fields: a log pipeline
// finds a machine's lines by provider id without parsing text.
func TestJSONLogs(t *testing.T) {
	t.Parallel()
	dsn := bmdbtest.NewDatabase(t)
	d := replicatest.Start(t, shepherdBinary, "shepherd", replicatest.EnvWithoutDSN(envDSN+"="+dsn), fastFleetFlags(20, "-log_format=json")...)
	var failed map[string]any
	bmdbtest.WaitFor(t, 60*time.Second, "a JSON line about a failed task", func() (bool, string) {
		for _, line := range strings.Split(d.Log(), "\n") {
			var obj map[string]any
			if json.Unmarshal([]byte(line), &obj) != nil {
				continue
			}
			if obj["msg"] == "Work failed" {
				failed = obj
				return true, ""
			}
		}
		return false, "none yet"
	})
	for _, key := range []string{"process", "machine", "provider_id", "session", "result", "cause"} {
		if v, ok := failed[key].(string); !ok || v == "" {
			t.Errorf("the failed task's line has no %s: %v", key, failed)
		}
	}
	if !strings.HasPrefix(fmt.Sprint(failed["provider_id"]), "sim-") {
		t.Errorf("provider_id %v, want the simulated machine's id", failed["provider_id"])
	}
	d.StopClean(10 * time.Second)
	for i, line := range strings.Split(d.Log(), "\n") {
		if line == "" {
			continue
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Errorf("line %d is not JSON (%v): %s", i+1, err, line)
		}
	}
}
