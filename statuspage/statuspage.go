// Package statuspage serves Shepherd's read-only status page: per process
// the queue (eligible, leased, backing off, failed in the last hour), the
// newest failures with their causes, the oldest leases and whether it is
// paused and why; per machine its tags, leases, backoffs and history.
//
// It is plain server-rendered HTML (html/template) with inline CSS and
// inline SVG, and no external asset (image, font, script file), because it
// is read where the machines are, which has no internet, often from a
// phone in a data centre aisle. One small inline script, allowed by its
// hash in the Content-Security-Policy, refreshes the overview in place for
// an operator who leaves it open; without it the page is a plain page. It
// only reads: every change goes through the CLI, which records who did
// what and why.
package statuspage

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"

	"github.com/google/uuid"
	"k8s.io/klog/v2"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Process is a process the status page reports on: its description and
// the candidate condition its eligible count needs.
type Process struct {
	Info       controlloop.Info
	Candidates bmdb.Candidates
	// Tags, if set, reads the process's own tags of a machine (from its
	// own tables), shown on the machine's page with Shepherd's tags.
	Tags func(ctx context.Context, tx bmdbapi.Tx, machine uuid.UUID) ([]Tag, error)
	// Limits are the process's safety limits and per-machine budget as
	// this daemon runs it, which the machine view's explanation judges
	// (zero: not judged).
	Limits bmdb.Limits
	// Explain, if set, reads the facts the process's condition reads on
	// a machine (a controlloop.Definition's Explain), which the machine
	// view's explanation shows.
	Explain func(ctx context.Context, tx bmdbapi.Tx, machine uuid.UUID) ([]bmdb.Fact, error)
}

// Tag is one line of a process's tags on a machine's page (a
// controlloop.Definition's Tags). The page escapes and bounds Value, which
// may come from the machine.
type Tag = controlloop.Tag

// FromRunners describes the processes of a daemon's runners.
func FromRunners(runners ...*controlloop.Runner) []Process {
	ps := make([]Process, len(runners))
	for i, r := range runners {
		ps[i] = Process{Info: r.Info(), Candidates: r.Candidates(), Limits: r.Limits()}
	}
	return ps
}

// Paths the handler serves.
const (
	PathOverview = "/status"
	PathMachine  = "/status/machine/"
)

// MachinePath is the status page of one machine.
func MachinePath(id uuid.UUID) string { return PathMachine + id.String() }

// Options tune the pages; the zero value is the defaults.
type Options struct {
	// Refresh is how often an open overview refreshes itself (default
	// 15 s; negative: never).
	Refresh time.Duration
	// StaleAfter tells a healthy agent from a stale one in the fleet
	// totals. Zero: the heartbeat timeout of a process whose condition
	// has one (Recovery's heartbeat_timeout), else 10 minutes.
	StaleAfter time.Duration
	// Program is the name of the binary serving the page, in the commands
	// its hints suggest ("fleetd resume ..."): the operator's binary may
	// not be called shepherd. Default: shepherd.
	Program string
}

// Defaults of the page's reads.
const (
	defaultRefresh    = 15 * time.Second
	defaultStaleAfter = 10 * time.Minute
	// totalsTTL: the fleet totals read the whole fleet's tag indexes, so
	// they are read at most this often, whatever the page's traffic.
	totalsTTL = 30 * time.Second
	// activityBuckets of activityWidth make the sparklines' hour.
	activityBuckets = 12
	activityWidth   = 5 * time.Minute
	// overviewTTL: the overview costs one fleet scan per process (the
	// eligible count); requests within this long of the last one share its
	// result, so that a page left reloading, or many operators at once, cost
	// the database no more than the runner's own gauges.
	overviewTTL = 2 * time.Second
	// recentFailures and oldestLeases bound the overview's lists.
	recentFailures = 10
	oldestLeases   = 5
	// machineHistory bounds a machine's timeline.
	machineHistory = 200
	// queryTimeout bounds one page's reads.
	queryTimeout = 10 * time.Second
)

//go:embed templates/*.html
var templateFS embed.FS

// templateFuncs are the templates' functions; prog, the program's name, is
// replaced per handler (Options.Program).
var templateFuncs = template.FuncMap{
	"prog":        func() string { return defaultProgram },
	"ago":         ago,
	"until":       untilText,
	"stamp":       stamp,
	"short":       short,
	"machinePath": MachinePath,
	"fingerprint": fingerprint,
	"eventClass":  eventClass,
	"sparkline":   sparkline,
	"refreshJS":   refreshJS,
	"bounded":     bounded,
}

// shownTextBytes bounds a reason or cause as a page shows it: an
// operator's reason stored by an older binary, which did not bound it,
// would otherwise grow the page by its whole size for every hold that
// carries it.
const shownTextBytes = 1000

// bounded is s cut to shownTextBytes, saying how much was cut
// (untrusted.Text; the page is escaped whole when written).
func bounded(s string) string { return untrusted.Text(s, shownTextBytes) }

// defaultProgram is Options.Program's default.
const defaultProgram = "shepherd"

// templates are the pages for the default program name, parsed once.
var templates = parseTemplates(defaultProgram)

// parseTemplates parses the pages with prog as the program the hints name.
func parseTemplates(prog string) *template.Template {
	return template.Must(template.New("").Funcs(templateFuncs).
		Funcs(template.FuncMap{"prog": func() string { return prog }}).
		ParseFS(templateFS, "templates/*.html"))
}

// handler serves the pages.
type handler struct {
	db        *operator.DB
	processes []Process
	opts      Options
	now       func() time.Time
	// tmpl are the pages, naming opts.Program in their hints.
	tmpl *template.Template

	mu       sync.Mutex
	cached   *overview
	cachedAt time.Time
	ttl      time.Duration
	totals   *operator.FleetTotals
	totalsAt time.Time
}

// New returns the status page handler for processes, which serves
// PathOverview and everything under PathMachine; mount it on those paths
// of the daemon's listener.
func New(db *bmdb.DB, processes []Process, opts Options) http.Handler {
	if opts.Refresh == 0 {
		opts.Refresh = defaultRefresh
	}
	if opts.StaleAfter <= 0 {
		opts.StaleAfter = staleAfter(processes)
	}
	h := &handler{db: operator.New(db), processes: processes, opts: opts, now: time.Now, ttl: overviewTTL, tmpl: templates}
	if opts.Program != "" && opts.Program != defaultProgram {
		h.tmpl = parseTemplates(opts.Program)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathOverview, h.serveOverview)
	mux.HandleFunc("GET "+PathOverview+"/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, PathOverview, http.StatusMovedPermanently)
	})
	// The lookup form of the overview submits ?id=.
	mux.HandleFunc("GET "+PathMachine+"{$}", h.serveLookup)
	mux.HandleFunc("GET "+PathMachine+"{id}", h.serveMachine)
	mux.HandleFunc(PathOverview+"/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the status page is read-only", http.StatusMethodNotAllowed)
			return
		}
		h.render(w, r, http.StatusNotFound, "error.html", errorPage{Title: "Not found", Message: "There is no such page."})
	})
	return mux
}

// staleAfter is the heartbeat timeout of the first process whose
// condition has one, the daemon's own notion of a dead agent.
func staleAfter(processes []Process) time.Duration {
	for _, p := range processes {
		if v, ok := p.Candidates.Arg("heartbeat_timeout"); ok {
			if d, ok := v.(time.Duration); ok && d > 0 {
				return d
			}
		}
	}
	return defaultStaleAfter
}

// overview is the data of the overview page.
type overview struct {
	Generated time.Time
	// RefreshSeconds is how often the page refreshes itself; 0: never.
	RefreshSeconds int
	// Totals are the fleet's counts, read at most every totalsTTL; nil
	// when they could not be read.
	Totals   *operator.FleetTotals
	TotalsAt time.Time
	// Reboots are the last hour's verified reboots; nil when they could
	// not be read.
	Reboots   *rebootsView
	Processes []processView
	// Names are the provider ids of the machines the page lists.
	Names map[uuid.UUID]string
	// Requests are the operators' pending and honoured run-now and cancel
	// requests; nil when they could not be read.
	Requests *requestsView
	// Holds are the held machines and the last escalations (holds.go);
	// nil when they could not be read.
	Holds *holdsView
	// OtherPauses are active pauses of processes this daemon does not run.
	OtherPauses []operator.Pause
	Sessions    []bmdb.SessionInfo
	Errors      []string
}

type processView struct {
	Label    string
	Name     string
	Counts   operator.ProcessCounts
	Pause    *operator.Pause
	Failures []bmdb.HistoryEntry
	// Recovered marks the failures (by history id) that a later success
	// on the same machine made good.
	Recovered map[int64]bool
	Leases    []operator.MachineState
	// Activity is the last hour's starts and failures, oldest first.
	Activity []operator.ActivityBucket
}

func (h *handler) serveOverview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	ov := h.overview(ctx)
	status := http.StatusOK
	if len(ov.Errors) > 0 && len(ov.Processes) == 0 {
		status = http.StatusServiceUnavailable
	}
	h.render(w, r, status, "overview.html", ov)
}

// overview reads the overview, or returns the one read less than ttl ago.
// A read that failed is not cached: the next request tries again.
func (h *handler) overview(ctx context.Context) *overview {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cached != nil && h.now().Sub(h.cachedAt) < h.ttl {
		return h.cached
	}
	ov := h.readOverview(ctx)
	if len(ov.Errors) == 0 {
		h.cached, h.cachedAt = ov, h.now()
	}
	return ov
}

func (h *handler) readOverview(ctx context.Context) *overview {
	ov := &overview{Generated: h.now(), Names: map[uuid.UUID]string{}}
	if h.opts.Refresh > 0 {
		ov.RefreshSeconds = max(1, int(h.opts.Refresh.Seconds()))
	}
	fail := func(err error) {
		klog.FromContext(ctx).Error(err, "Status page: reading the overview failed")
		ov.Errors = append(ov.Errors, err.Error())
	}
	pauses, err := h.db.Pauses(ctx)
	if err != nil {
		fail(err)
	}
	running := map[string]bool{}
	for _, p := range h.processes {
		name := p.Info.Process.Name
		running[name] = true
		pv := processView{Label: p.Info.Label, Name: name}
		for i := range pauses {
			if pauses[i].Process == name && pauses[i].Active() {
				pv.Pause = &pauses[i]
			}
		}
		if pv.Counts, err = h.db.ProcessCounts(ctx, p.Info.Process, p.Candidates); err != nil {
			fail(err)
			continue
		}
		if pv.Failures, err = h.db.RecentFailures(ctx, name, recentFailures); err != nil {
			fail(err)
		}
		if pv.Recovered, err = h.db.Recovered(ctx, pv.Failures); err != nil {
			fail(err)
		}
		if pv.Leases, err = h.db.Machines(ctx, operator.MachineQuery{Process: p.Info.Process, State: operator.StateLeased, Limit: oldestLeases}); err != nil {
			fail(err)
		}
		if pv.Activity, err = h.db.Activity(ctx, name, activityWidth, activityBuckets); err != nil {
			fail(err)
		}
		ov.Processes = append(ov.Processes, pv)
	}
	ov.Requests = h.requests(ctx, fail)
	listed := ov.Requests.machines()
	for _, pv := range ov.Processes {
		for _, f := range pv.Failures {
			listed = append(listed, f.Machine)
		}
		for _, l := range pv.Leases {
			listed = append(listed, l.Machine)
		}
	}
	ov.Holds = h.holds(ctx, fail)
	listed = append(listed, ov.Holds.machines()...)
	names, err := h.db.ProviderIDs(ctx, listed)
	if err != nil {
		fail(err)
	}
	for id, name := range names {
		ov.Names[id] = untrusted.Line(name, 120)
	}
	if h.totals == nil || h.now().Sub(h.totalsAt) >= totalsTTL {
		t, err := h.db.FleetTotals(ctx, h.opts.StaleAfter)
		if err != nil {
			fail(err)
		} else {
			h.totals, h.totalsAt = &t, h.now()
		}
	}
	ov.Totals, ov.TotalsAt = h.totals, h.totalsAt
	ov.Reboots = h.reboots(ctx, fail)
	for _, p := range pauses {
		if p.Active() && !running[p.Process] {
			ov.OtherPauses = append(ov.OtherPauses, p)
		}
	}
	if ov.Sessions, err = h.db.Sessions(ctx); err != nil {
		fail(err)
	}
	return ov
}

// serveLookup sends the overview's search form to the machine's page: a
// machine UUID, or a provider id ("rack1-07", a hostname) as operators
// know machines. An id several providers use lists the matches.
func (h *handler) serveLookup(w http.ResponseWriter, r *http.Request) {
	raw := strings.TrimSpace(r.URL.Query().Get("id"))
	if id, err := uuid.Parse(raw); err == nil {
		http.Redirect(w, r, MachinePath(id), http.StatusSeeOther)
		return
	}
	shown := untrusted.Line(raw, 120)
	if raw == "" || len(raw) > 512 {
		h.render(w, r, http.StatusBadRequest, "error.html", errorPage{
			Title:   "Nothing to look up",
			Message: "Give a machine ID (a UUID) or a provider id (as the provider names the machine, such as sim-0002).",
		})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	found, err := h.db.MachinesByProviderID(ctx, raw)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Status page: reading the BMDB failed", "path", r.URL.Path)
		h.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "BMDB unavailable", Message: err.Error()})
	case len(found) == 0:
		h.render(w, r, http.StatusNotFound, "error.html", errorPage{
			Title:   "No machine matches",
			Message: fmt.Sprintf("No machine has the ID or provider id %q.", shown),
		})
	case len(found) == 1:
		http.Redirect(w, r, MachinePath(found[0].Machine), http.StatusSeeOther)
	default:
		h.render(w, r, http.StatusOK, "matches.html", matchesPage{Query: shown, Machines: found})
	}
}

// matchesPage lists the machines of several providers that share a
// provider id.
type matchesPage struct {
	Query    string
	Machines []bmdb.Provided
}

// machinePage is the data of a machine's page.
type machinePage struct {
	Generated time.Time
	operator.MachineDetail
	// Timeline is History, newest first.
	Timeline []bmdb.HistoryEntry
	// ProcessTags are the tags the processes' Tags functions read.
	ProcessTags []Tag
	// Power is the last power state Recovery read (nil: never read, or
	// unreadable now).
	Power *bmdb.PowerRead
	// Explain says, per process, whether it would act on the machine and
	// every reason it will not (shepherd explain); nil when it could not
	// be read.
	Explain []operator.Explanation
}

func (h *handler) serveMachine(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.render(w, r, http.StatusBadRequest, "error.html", errorPage{
			Title:   "Not a machine ID",
			Message: fmt.Sprintf("%q is not a machine ID.", r.PathValue("id")),
		})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	d, err := h.db.Machine(ctx, id, machineHistory)
	switch {
	case errors.Is(err, bmdb.ErrNotFound):
		h.render(w, r, http.StatusNotFound, "error.html", errorPage{
			Title:   "Unknown machine",
			Message: fmt.Sprintf("The BMDB has no machine %s and no history of one.", id),
		})
		return
	case err != nil:
		klog.FromContext(ctx).Error(err, "Status page: reading the BMDB failed", "path", r.URL.Path)
		h.render(w, r, http.StatusServiceUnavailable, "error.html", errorPage{Title: "BMDB unavailable", Message: err.Error()})
		return
	}
	page := machinePage{Generated: h.now(), MachineDetail: d}
	if d.Exists {
		page.ProcessTags = h.processTags(ctx, id)
		page.Power = h.power(ctx, id)
		page.Explain = h.explain(ctx, id)
	}
	for i := len(d.History) - 1; i >= 0; i-- {
		page.Timeline = append(page.Timeline, d.History[i])
	}
	h.render(w, r, http.StatusOK, "machine.html", page)
}

// explain is the machine's explanation for the page's processes, from
// their own conditions (as shepherd explain reads it); nil on error,
// which is logged: the rest of the page is still worth showing.
func (h *handler) explain(ctx context.Context, machine uuid.UUID) []operator.Explanation {
	ps := make([]operator.ExplainProcess, len(h.processes))
	for i, p := range h.processes {
		ps[i] = operator.ExplainProcess{Process: p.Info.Process, Candidates: &p.Candidates,
			Limits: p.Limits, Facts: p.Explain}
	}
	ex, err := h.db.ExplainMachine(ctx, machine, ps)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Status page: explaining a machine failed", "machine", machine)
		return nil
	}
	return ex.Processes
}

// power is the last power state read of machine, nil when none was read
// or it cannot be read now (logged: the rest of the page is still worth
// showing).
func (h *handler) power(ctx context.Context, machine uuid.UUID) *bmdb.PowerRead {
	reads, err := h.db.PowerReads(ctx, []uuid.UUID{machine})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Status page: reading the power state failed", "machine", machine)
		return nil
	}
	if p, ok := reads[machine]; ok {
		return &p
	}
	return nil
}

// ReadTags reads the tags of machine that read (a Process's Tags) finds, in
// one BMDB transaction, bounded and cleaned: they may come from the
// machine. The status page and the tags command show them.
func ReadTags(ctx context.Context, db bmdbapi.DB, machine uuid.UUID, read func(ctx context.Context, tx bmdbapi.Tx, machine uuid.UUID) ([]Tag, error)) ([]Tag, error) {
	var tags []Tag
	err := db.Transact(ctx, func(ctx context.Context, tx bmdbapi.Tx) error {
		var err error
		tags, err = read(ctx, tx, machine)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, t := range tags {
		tags[i] = Tag{Name: untrusted.Line(t.Name, 200), Value: untrusted.Line(t.Value, 0)}
	}
	return tags, nil
}

// processTags reads the processes' own tags of machine. A process whose
// read fails shows the failure in place of its tags: the rest of the page
// is still worth seeing.
func (h *handler) processTags(ctx context.Context, machine uuid.UUID) []Tag {
	var out []Tag
	for _, p := range h.processes {
		if p.Tags == nil {
			continue
		}
		tags, err := ReadTags(ctx, h.db.Public(), machine, p.Tags)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Status page: reading a process's tags failed", "process", p.Info.Label, "machine", machine)
			tags = []Tag{{Name: p.Info.Label, Value: untrusted.Line("cannot read its tags: "+err.Error(), 0)}}
		}
		out = append(out, tags...)
	}
	return out
}

type errorPage struct {
	Title   string
	Message string
}

// render writes a page with headers that keep it self-contained: the
// Content-Security-Policy allows nothing but the page's own inline style,
// the refresh script (by its hash) and requests to the page's own origin,
// which is what "no external assets" means to a browser.
//
// html/template escapes markup but passes control characters and
// bidirectional overrides through, and the page's strings come from the
// BMDB, where machines, BMCs and providers put them: a U+202E in a
// provider id reverses it on screen. The templates hold none of those
// characters, so every one in the rendered page came from data, and
// escaping the whole page (untrusted.Visible: \x1b, \x9b, \u202e) covers
// every field, including ones added later.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var b strings.Builder
	if err := h.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		klog.FromContext(r.Context()).Error(err, "Status page: rendering failed", "template", name)
		http.Error(w, "rendering the status page failed", http.StatusInternalServerError)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; script-src '"+refreshScriptHash+"'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprint(w, untrusted.Visible(b.String()))
}

// ago says how long before now t was, coarsely, as an operator reads it.
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	switch {
	case d < 0 && -d >= time.Second:
		return "in " + coarse(-d)
	case d < time.Second:
		return "just now"
	}
	return coarse(d) + " ago"
}

// untilText says how long until t, or how long ago it passed.
func untilText(t time.Time) string {
	d := time.Until(t)
	if d < 0 {
		return "ended " + coarse(-d) + " ago"
	}
	return "for " + coarse(d)
}

func coarse(d time.Duration) string {
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(math.Mod(d.Minutes(), 60)))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// stamp is an unambiguous UTC time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// short is the first block of a UUID: enough to tell sessions apart on a
// small screen; the full ID is in the element's title.
func short(id uuid.UUID) string {
	if id == uuid.Nil {
		return "-"
	}
	return id.String()[:8]
}

// fingerprint is an agent key as OpenSSH prints fingerprints.
func fingerprint(key []byte) string {
	if len(key) == 0 {
		return "-"
	}
	sum := sha256.Sum256(key)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// eventClass colours history events.
func eventClass(event bmdb.Event) string {
	switch event {
	case bmdb.EventFinished, bmdb.EventRescheduled, bmdb.EventRecovered:
		return "ok"
	case bmdb.EventFailed, bmdb.EventLost, bmdb.EventNotRecovered:
		return "bad"
	case operator.EventBackoffCleared, operator.EventRetried, operator.EventForcedRun:
		return "op"
	default:
		return ""
	}
}
