package statuspage

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
	"github.com/shepherd-fleet/shepherd/statuspage/statuspagetest"
)

// A machine's page explains, per process, whether it would act and why
// not (shepherd explain), and shows a pending run-now request with its
// actor and reason.
func TestMachinePageExplains(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	ctx := context.Background()
	if _, err := operator.New(f.DB).RequestRun(ctx, f.Leased, recovery.Process.Name, "workload <wedged>", bmdb.Actor{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()
	code, _, body := get(t, srv, MachinePath(f.Leased))
	if code != http.StatusOK {
		t.Fatalf("machine page: %d\n%s", code, body)
	}
	for _, want := range []string{
		"Would the processes act?",
		"leased in exclusion group Shepherd by ShepherdAgentStart", // Recovery waits for AgentStart's lease
		"run-now pending since", "by alice: workload &lt;wedged&gt;",
		"shepherd explain " + f.Leased.String(),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("machine page lacks %q", want)
		}
	}
	// The daemon's limits and budget, judged as a claim would.
	limited := slices.Clone(processes)
	limited[0].Limits = bmdb.Limits{MaxInFlight: 1, MachineBudget: bmdb.MachineBudget{N: 5, Window: time.Hour}}
	lsrv := httptest.NewServer(New(f.DB, limited, Options{}))
	defer lsrv.Close()
	_, _, lbody := get(t, lsrv, MachinePath(f.Leased))
	for _, want := range []string{"in-flight limit reached: 1 leases of max 1", "budget used: 1 of 5 in 1h0m0s"} {
		if !strings.Contains(lbody, want) {
			t.Errorf("machine page with the daemon's limits lacks %q", want)
		}
	}
	code, _, body = get(t, srv, MachinePath(f.Failed))
	if code != http.StatusOK || !strings.Contains(body, "condition recovery does not hold (agent: none started)") {
		t.Errorf("the failed machine's page: %d, want Recovery's condition and its facts among the reasons", code)
	}
}

// The overview lists pending run-now requests and the forced runs claims
// honoured, with reason, actor and time.
func TestOverviewShowsOperatorRequests(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	ctx := context.Background()
	alice := bmdb.Actor{Name: "alice"}
	if _, err := operator.New(f.DB).RequestRun(ctx, f.Leased, recovery.Process.Name, "waits for the lease", alice); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(f.DB).RequestRun(ctx, f.Finished, recovery.Process.Name, "INC-7: wedged <workload>", alice); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(f.DB).ResumeProcess(ctx, recovery.Process.Name); err != nil { // the fleet pauses it
		t.Fatal(err)
	}
	bmdbtest.Register(t, f.DB, recovery.Process, recovery.Candidates(30*time.Minute, 10*time.Minute))
	leases, err := f.Session.Claim(ctx, bmdb.ClaimOptions{Process: recovery.Process, Candidates: recovery.Candidates(30*time.Minute, 10*time.Minute)})
	if err != nil || leases[0].Machine != f.Finished {
		t.Fatalf("the forced claim: %v, %v; want %s", leases, err, f.Finished)
	}
	w := leases[0]
	if err := w.Finish(ctx, nil); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()
	_, _, body := get(t, srv, "/status")
	for _, want := range []string{
		"Operator requests", "<td>run-now</td>", "waits for the lease", // pending
		"Forced runs", "INC-7: wedged &lt;workload&gt;", "<td>alice <span class=\"muted\">(", // honoured, with the role
		`href="/status/machine/` + f.Finished.String() + `"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
}
