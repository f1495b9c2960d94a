package daemon

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// The daemon's status page answers 503 until the loops exist, then serves
// the page of their processes.
func TestStatusPageLateBinding(t *testing.T) {
	t.Parallel()
	var sp statusPage
	mux := http.NewServeMux()
	sp.register(mux, "")
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/status"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("before the loops: %d %q, want 503", code, body)
	}

	db := bmdbtest.NewDB(t, bmdb.Options{})
	def := agentstart.Definition()
	h, err := def.New(controlloop.Env{Provider: sim.New(db.Public(), sim.DefaultConfig()), DB: db.Public()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := controlloop.NewRunner(db.Public(), def, h, controlloop.DefaultConfig(def.Info), controlloop.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	sp.set(db, []*controlloop.Runner{r}, nil)
	if code, body := get("/status"); code != http.StatusOK || !strings.Contains(body, "agentstart") {
		t.Errorf("with the loops: %d, want 200 and the agentstart section", code)
	}
	if code, _ := get("/status/machine/not-a-uuid"); code != http.StatusBadRequest {
		t.Errorf("/status/machine/not-a-uuid: %d, want 400", code)
	}
}
