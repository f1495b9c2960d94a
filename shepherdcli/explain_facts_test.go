package shepherdcli

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/gobuild"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
)

// explain says why each process's own condition does not hold with the
// facts its definition's Explain read: a user's process's (RackAudit: the
// machine's location), the shipped Recovery's (its agent), and for a
// process whose definition has no Explain (Quiet) a line saying so. It
// once rendered AgentStart's facts (the agent's start) for every process.
func TestExplainUserProcess(t *testing.T) {
	t.Parallel()
	bin, err := gobuild.Build(t.TempDir(), "./testdata/userexplain", nil)
	if err != nil {
		t.Fatal(err)
	}
	dsn := bmdbtest.NewDatabase(t)
	db := bmdbtest.Open(t, dsn)
	m := bmdbtest.AddMachines(t, db, 1)[0]
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append(args, "-bmdb_dsn", dsn)...)
		cmd.Env = replicatest.EnvWithoutDSN()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("userexplain %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String()
	}

	text := run("explain", m.String())
	lines := map[string]string{}
	var process string
	for _, l := range strings.Split(text, "\n") {
		if name, _, ok := strings.Cut(l, ": "); ok && !strings.HasPrefix(l, " ") {
			process = name
		}
		if strings.Contains(l, "- condition ") {
			lines[process] = l
		}
	}
	for process, want := range map[string]string{
		"RackAudit":        "condition rack_audit does not hold (location: ; audited under: audit/)",
		"ShepherdRecovery": "condition recovery does not hold (agent: none started)",
		"Quiet":            "condition never does not hold (Quiet does not explain its condition: its definition has no Explain)",
	} {
		if !strings.Contains(lines[process], want) {
			t.Errorf("explain of %s: %q, want %q\n%s", process, lines[process], want, text)
		}
	}
	if strings.Contains(lines["RackAudit"], "agent") || strings.Contains(lines["Quiet"], "agent") {
		t.Errorf("a user's process explained with the agent's facts:\n%s", text)
	}

	var ex operator.MachineExplanation
	if err := json.Unmarshal([]byte(run("explain", m.String(), "-process", "rackaudit", "-o", "json")), &ex); err != nil {
		t.Fatal(err)
	}
	if len(ex.Processes) != 1 || len(ex.Processes[0].Facts) != 2 || ex.Processes[0].Facts[1] != (bmdb.Fact{Name: "audited under", Value: "audit/"}) {
		t.Errorf("explain -o json of RackAudit: %+v, want its two facts", ex.Processes)
	}
}
