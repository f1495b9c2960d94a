package statuspage

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/statuspage/statuspagetest"
)

// The overview lists held machines with reason, actor and time, and the
// escalations of a per-machine budget with their count and causes; text
// from operators is shown as text.
func TestHoldsAndEscalationsShown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := statuspagetest.NewFleet(t)
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()
	if _, err := operator.New(f.DB).Hold(ctx, f.Twins[:1], "", `DIMM swap <b>ticket</b> 4711`, 0, bmdb.Actor{Name: "tech-anna"}); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.New(f.DB).Hold(ctx, f.Twins[1:], agentstart.Process.Name, "quick look", time.Hour, bmdb.Actor{Name: "tech-ben"}); err != nil {
		t.Fatal(err)
	}
	// The failed machine's backoff ends at once; a budget of one lease an
	// hour, which it used, escalates it at the next claim.
	if _, err := operator.New(f.DB).Retry(ctx, f.Failed, agentstart.Process.Name, "try again"); err != nil {
		t.Fatal(err)
	}
	var escalated []bmdb.Escalation
	limits := bmdb.Limits{MachineBudget: bmdb.MachineBudget{N: 1, Window: time.Hour}}
	onEscalated := func(e bmdb.Escalation) { escalated = append(escalated, e) }
	bmdbtest.Register(t, f.DB, agentstart.Process, agentstart.Candidates())
	for range 10 {
		leases, err := f.Session.Claim(ctx, bmdb.ClaimOptions{Process: agentstart.Process, Candidates: agentstart.Candidates(), Max: 10, Limits: limits, OnEscalated: onEscalated})
		if err != nil {
			break
		}
		for _, l := range leases {
			if err := l.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(escalated) > 0 {
			break
		}
	}
	if len(escalated) == 0 {
		t.Fatal("no machine escalated")
	}
	_, _, body := get(t, srv, "/status")
	for _, want := range []string{
		`<section id="holds">`, "Held machines", "tech-anna", "DIMM swap &lt;b&gt;ticket&lt;/b&gt; 4711", "tech-ben", "quick look",
		"<td class=\"mono\">all</td>", "Escalations", "budget exhausted: 1 leases within 1h0m0s", "shepherd release",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	if strings.Contains(body, "<b>ticket</b>") {
		t.Error("/status shows an operator's reason as markup")
	}
}

// A reason stored unbounded (by a release before reasons were bounded)
// is shown cut to 1,000 bytes, saying how much was cut: a page of a
// thousand such holds stays a page.
func TestLongReasonShownBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := statuspagetest.NewFleet(t)
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()
	if _, err := operator.New(f.DB).Hold(ctx, f.Twins[:1], "", "short for now", 0, bmdb.Actor{Name: "tech-anna"}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 100_000)
	err := f.DB.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machine_hold SET reason = $1`, long)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, _, body := get(t, srv, "/status")
	if strings.Contains(body, strings.Repeat("x", shownTextBytes+1)) || !strings.Contains(body, "[truncated") {
		t.Errorf("the overview shows more than %d bytes of a reason (page %d bytes)", shownTextBytes, len(body))
	}
}
