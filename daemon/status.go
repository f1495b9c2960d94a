package daemon

import (
	"net/http"
	"sync/atomic"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/statuspage"
)

// statusPoolSize is the status page's own connection pool: a few
// concurrent page loads; more wait, each bounded by the page's timeout.
const statusPoolSize = 3

// statusPage serves the read-only status page (package statuspage) on the
// daemon's listener. The listener starts before the database and the loops
// exist, so the page is bound late: until set is called it answers 503,
// saying the daemon is starting, as /readyz does.
//
// Wiring: register it on the mux of newHandler, and call set once
// buildLoops has returned the runners.
type statusPage struct {
	h atomic.Pointer[http.Handler]
	// prog is the program's name, in the page's command hints.
	prog string
}

// register routes /status and everything under it to the page, behind
// token when it is not empty (-status_token_file): the page shows failure
// causes and machine addresses.
func (s *statusPage) register(mux *http.ServeMux, token string) {
	h := requireToken(token, s)
	mux.Handle(statuspage.PathOverview, h)
	mux.Handle(statuspage.PathOverview+"/", h)
}

// set binds the page to the database and the running loops, whose
// processes' definitions (loops, one per runner, in the same order) show
// their tags.
func (s *statusPage) set(db *bmdb.DB, runners []*controlloop.Runner, loops []Loop) {
	ps := statuspage.FromRunners(runners...)
	for i := range ps {
		if i < len(loops) {
			ps[i].Tags = loops[i].Definition.Tags
			ps[i].Explain = loops[i].Definition.Explain
		}
	}
	h := statuspage.New(db, ps, statuspage.Options{Program: s.prog})
	s.h.Store(&h)
}

func (s *statusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := s.h.Load()
	if h == nil {
		w.Header().Set("Retry-After", "5")
		http.Error(w, s.prog+" is starting: the status page is served once the database is reachable and the loops run", http.StatusServiceUnavailable)
		return
	}
	(*h).ServeHTTP(w, r)
}
