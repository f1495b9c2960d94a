package statuspage

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// A machine's page explains, per process, whether it would act and why
// not (shepherd explain), and shows a pending run-now request with its
// actor and reason.
func TestMachinePageExplains(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ctx := context.Background()
	if _, err := f.db.RequestRun(ctx, f.leased, recovery.Process.Name, "workload <wedged>", bmdb.Actor{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(f.db, processes, Options{}))
	defer srv.Close()
	code, _, body := get(t, srv, MachinePath(f.leased))
	if code != http.StatusOK {
		t.Fatalf("machine page: %d\n%s", code, body)
	}
	for _, want := range []string{
		"Would the processes act?",
		"leased in exclusion group Shepherd by ShepherdAgentStart", // Recovery waits for AgentStart's lease
		"run-now pending since", "by alice: workload &lt;wedged&gt;",
		"shepherd explain " + f.leased.String(),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("machine page lacks %q", want)
		}
	}
	code, _, body = get(t, srv, MachinePath(f.failed))
	if code != http.StatusOK || !strings.Contains(body, "condition recovery does not hold (no agent started)") {
		t.Errorf("the failed machine's page: %d, want Recovery's condition and its facts among the reasons", code)
	}
}
