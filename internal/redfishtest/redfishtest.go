// Package redfishtest is a small Redfish service for tests: an httptest
// server implementing the service root, the Systems collection, one
// ComputerSystem and its Reset action, with HTTP Basic authentication. It
// records every request and every reset, so that a test can check what a
// client did to the "BMC".
package redfishtest

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure a Server. Zero values are defaulted.
type Options struct {
	// Username and Password are the only accepted Basic credentials
	// (default "admin" and "s3cret:pass", a password with a colon).
	Username, Password string
	// SystemID is the Id of the one system (default "1").
	SystemID string
	// SystemName is the system's Name (default "Test System").
	SystemName string
	// RedirectName makes a GET of the Systems collection's link followed
	// by SystemName answer 307 to the system's path, as sushy-tools does
	// for a system asked for by Name.
	RedirectName bool
	// AllowedResetTypes are advertised and accepted (default On, ForceOff,
	// ForceRestart, GracefulRestart, PowerCycle).
	AllowedResetTypes []string
	// TLS serves HTTPS with httptest's self-signed certificate; see CAFile.
	TLS bool
	// OnReset, if set, runs (in the request's goroutine, before the
	// response) for each accepted reset.
	OnReset func(resetType string)
	// PowerState is the system's PowerState at start (default "On"). An
	// accepted reset On powers it on, ForceOff off; the others leave it
	// as it is (as a BMC whose restart of a machine that is off does
	// nothing). SetPowerState changes it.
	PowerState string

	// Hostile behaviours, for tests of a client's bounds.

	// EndlessSystems, if positive, makes the Systems collection endless:
	// every page lists the system, is padded (in its Description) to about
	// EndlessSystems bytes, and links to a next page with
	// Members@odata.nextLink.
	EndlessSystems int
	// ResetTarget, if set, replaces the target of the system's Reset
	// action, e.g. with a link such as "@127.0.0.1:PORT/x" that leads a
	// client building URLs as endpoint + link to another host.
	ResetTarget string
}

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	// Authorized reports whether the request carried the right Basic
	// credentials.
	Authorized bool
	// Status is the HTTP status of the answer.
	Status int
}

// Reset is one accepted reset action.
type Reset struct {
	SystemID  string
	ResetType string
	At        time.Time
}

// Server is a running test Redfish service.
type Server struct {
	// URL is the service's base URL, e.g. http://127.0.0.1:41234; clients
	// append /redfish/v1.
	URL string

	opts Options
	srv  *httptest.Server

	mu       sync.Mutex
	sent     int64 // bytes of response bodies written
	requests []Request
	resets   []Reset
	power    string
	busy     bool
	notify   chan struct{}
	firmware firmware
	flaky    flakyState // SetFlaky (flaky.go)
}

// SetBusy makes every request but the service root's answer 409
// Conflict (busy true), as a BMC in the middle of another operation, or
// answer normally again.
func (s *Server) SetBusy(busy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy = busy
}

// SetPowerState sets the system's PowerState ("On", "Off", or anything a
// BMC might say, such as "PoweringOn"), as a machine whose PSU tripped.
func (s *Server) SetPowerState(state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.power = state
}

// PowerState is the system's PowerState now.
func (s *Server) PowerState() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.power
}

// Start starts a server; it stops when t ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Username == "" {
		opts.Username = "admin"
	}
	if opts.Password == "" {
		opts.Password = "s3cret:pass"
	}
	if opts.SystemID == "" {
		opts.SystemID = "1"
	}
	if opts.AllowedResetTypes == nil {
		opts.AllowedResetTypes = []string{"On", "ForceOff", "ForceRestart", "GracefulRestart", "PowerCycle"}
	}
	if opts.SystemName == "" {
		opts.SystemName = "Test System"
	}
	if opts.PowerState == "" {
		opts.PowerState = "On"
	}
	s := &Server{opts: opts, power: opts.PowerState, notify: make(chan struct{}, 1)}
	if opts.TLS {
		s.srv = httptest.NewTLSServer(http.HandlerFunc(s.handle))
	} else {
		s.srv = httptest.NewServer(http.HandlerFunc(s.handle))
	}
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// Close stops the server early.
func (s *Server) Close() { s.srv.Close() }

// WriteCredentials writes the accepted credentials to a file in dir, in the
// "username:password" format, and returns its path.
func (s *Server) WriteCredentials(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "bmc-credentials")
	if err := os.WriteFile(p, []byte(s.opts.Username+":"+s.opts.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// WriteCAFile writes the TLS server's certificate as PEM to a file in dir
// and returns its path; the server must have been started with TLS.
func (s *Server) WriteCAFile(t testing.TB, dir string) string {
	t.Helper()
	cert := s.srv.Certificate()
	if cert == nil {
		t.Fatal("redfishtest: WriteCAFile on a server without TLS")
	}
	p := filepath.Join(dir, "bmc-ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Resets returns the resets accepted so far.
func (s *Server) Resets() []Reset {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Reset(nil), s.resets...)
}

// BytesSent returns how many bytes of response bodies the server wrote
// so far (into the connection: a client may have read fewer).
func (s *Server) BytesSent() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// countingWriter counts what is written into the server's sent.
type countingWriter struct {
	http.ResponseWriter
	s *Server
	// req is the index of the request in s.requests, whose Status is
	// set before the answer's header is sent.
	req int
}

func (w countingWriter) WriteHeader(code int) {
	w.setStatus(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w countingWriter) setStatus(code int) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if r := &w.s.requests[w.req]; r.Status == 0 {
		r.Status = code
	}
}

func (w countingWriter) Write(p []byte) (int, error) {
	w.setStatus(http.StatusOK)
	n, err := w.ResponseWriter.Write(p)
	w.s.mu.Lock()
	w.s.sent += int64(n)
	w.s.mu.Unlock()
	return n, err
}

// WaitResets waits until at least n resets were accepted, or fails t after
// timeout.
func (s *Server) WaitResets(t testing.TB, n int, timeout time.Duration) []Reset {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if r := s.Resets(); len(r) >= n {
			return r
		}
		select {
		case <-s.notify:
		case <-deadline:
			t.Fatalf("redfishtest: %d resets after %s, want %d", len(s.Resets()), timeout, n)
		}
	}
}

func (s *Server) systemPath() string { return "/redfish/v1/Systems/" + s.opts.SystemID }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	user, pass, ok := r.BasicAuth()
	authorized := ok && user == s.opts.Username && pass == s.opts.Password
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Authorized: authorized})
	w = countingWriter{w, s, len(s.requests) - 1}
	busy := s.busy
	s.mu.Unlock()

	// The service root is readable without credentials, as on real BMCs.
	if r.URL.Path == "/redfish/v1/" || r.URL.Path == "/redfish/v1" {
		serveGet(w, r, map[string]any{
			"@odata.id":      "/redfish/v1/",
			"@odata.type":    "#ServiceRoot.v1_5_0.ServiceRoot",
			"Id":             "RootService",
			"Name":           "Root Service",
			"RedfishVersion": "1.6.0",
			"Systems":        map[string]string{"@odata.id": "/redfish/v1/Systems"},
		})
		return
	}
	if !authorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="redfishtest"`)
		httpError(w, http.StatusUnauthorized)
		return
	}
	if busy {
		httpError(w, http.StatusConflict)
		return
	}
	if s.opts.RedirectName && r.URL.Path == "/redfish/v1/Systems/"+s.opts.SystemName {
		http.Redirect(w, r, s.systemPath(), http.StatusTemporaryRedirect)
		return
	}
	switch r.URL.Path {
	case "/redfish/v1/Systems", "/redfish/v1/Systems/":
		if s.opts.EndlessSystems > 0 {
			s.serveEndlessPage(w, r)
			return
		}
		serveGet(w, r, map[string]any{
			"@odata.id":           "/redfish/v1/Systems",
			"@odata.type":         "#ComputerSystemCollection.ComputerSystemCollection",
			"Name":                "Computer System Collection",
			"Members":             []map[string]string{{"@odata.id": s.systemPath()}},
			"Members@odata.count": 1,
		})
	case s.systemPath():
		serveGet(w, r, s.withFirmware(map[string]any{
			"@odata.id":   s.systemPath(),
			"@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
			"Id":          s.opts.SystemID,
			"Name":        s.opts.SystemName,
			"PowerState":  s.answeredPowerState(),
			"Actions": map[string]any{
				"#ComputerSystem.Reset": map[string]any{
					"target":                            s.resetTarget(),
					"ResetType@Redfish.AllowableValues": s.opts.AllowedResetTypes,
				},
			},
		}))
	case managerPath:
		s.serveManager(w, r)
	case s.systemPath() + "/Actions/ComputerSystem.Reset":
		s.serveReset(w, r)
	default:
		httpError(w, http.StatusNotFound)
	}
}

// serveReset answers the system's Reset action: an allowed ResetType is
// recorded (and On and ForceOff change the power state), any other is
// answered 400.
func (s *Server) serveReset(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		httpError(w, http.StatusMethodNotAllowed)
		return
	}
	var body struct{ ResetType string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		httpError(w, http.StatusBadRequest)
		return
	}
	allowed := false
	for _, t := range s.opts.AllowedResetTypes {
		allowed = allowed || t == body.ResetType
	}
	if !allowed {
		httpError(w, http.StatusBadRequest)
		return
	}
	if s.opts.OnReset != nil {
		s.opts.OnReset(body.ResetType)
	}
	s.mu.Lock()
	s.resets = append(s.resets, Reset{SystemID: s.opts.SystemID, ResetType: body.ResetType, At: time.Now()})
	switch body.ResetType {
	case "On":
		s.power = "On"
	case "ForceOff":
		s.power = "Off"
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) resetTarget() string {
	if s.opts.ResetTarget != "" {
		return s.opts.ResetTarget
	}
	return s.systemPath() + "/Actions/ComputerSystem.Reset"
}

// serveEndlessPage answers a page of the endless Systems collection (see
// Options.EndlessSystems); the page number is the query's page.
func (s *Server) serveEndlessPage(w http.ResponseWriter, r *http.Request) {
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	serveGet(w, r, map[string]any{
		"@odata.id":              "/redfish/v1/Systems",
		"@odata.type":            "#ComputerSystemCollection.ComputerSystemCollection",
		"Name":                   "Computer System Collection",
		"Description":            strings.Repeat("x", s.opts.EndlessSystems),
		"Members":                []map[string]string{{"@odata.id": s.systemPath()}},
		"Members@odata.nextLink": fmt.Sprintf("/redfish/v1/Systems?page=%d", page+1),
	})
}

// serveGet answers a GET with v as JSON, and any other method with 405.
func serveGet(w http.ResponseWriter, r *http.Request, v any) {
	if r.Method != http.MethodGet {
		httpError(w, http.StatusMethodNotAllowed)
		return
	}
	writeJSON(w, v)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// httpError answers with a Redfish-style error body.
func httpError(w http.ResponseWriter, code int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"error": map[string]any{
			"code":    fmt.Sprintf("Base.1.0.HTTP%d", code),
			"message": http.StatusText(code),
		},
	})
}
