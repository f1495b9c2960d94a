package redfish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stmcginnis/gofish"

	"github.com/shepherd-fleet/shepherd/internal/redfishtest"
)

func credsFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(p, []byte("admin:secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A BMC answering 500 with a NUL in its body, or with 100 MiB, yields an
// error of a few KiB: the body is cut where it is read, never held whole.
func TestHostileBMCAnswersAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		body func(w http.ResponseWriter) int64
	}{
		{"nul", func(w http.ResponseWriter) int64 {
			n, _ := w.Write([]byte("internal error \x00\xff\x1b[2J"))
			return int64(n)
		}},
		{"100MiB", func(w http.ResponseWriter) int64 {
			chunk := []byte(strings.Repeat("A", 64<<10))
			var sent int64
			for sent < 100<<20 {
				n, err := w.Write(chunk)
				sent += int64(n)
				if err != nil {
					break
				}
			}
			return sent
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sent atomic.Int64
			bmc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				sent.Store(tc.body(w))
			}))
			defer bmc.Close()
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := New(Config{Timeout: 10 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: credsFile(t), AllowHTTP: true})
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatal("Reset succeeded against a BMC answering 500")
			}
			if len(err.Error()) > 2*maxErrorBody {
				t.Errorf("error of %d bytes, want at most %d", len(err.Error()), 2*maxErrorBody)
			}
			if tc.name == "100MiB" {
				if !strings.Contains(err.Error(), "[answer cut after 4096 bytes]") {
					t.Errorf("the error does not say the answer was cut: %.300q", err.Error())
				}
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
					t.Errorf("Reset allocated %d MiB for a 100 MiB answer", grew>>20)
				}
			}
		})
	}
}

// An https BMC redirecting to http (or to another host) does not get the
// credentials sent there: the redirect is refused.
func TestRedirectAcrossSchemeOrHostRefused(t *testing.T) {
	var leaked atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Store(true)
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer target.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusFound)
	}))
	defer redirector.Close()
	err := New(Config{Timeout: 10 * time.Second}).Reset(context.Background(), Target{Endpoint: redirector.URL, CredentialsFile: credsFile(t), AllowHTTP: true})
	if err == nil || !strings.Contains(err.Error(), "refusing a redirect") {
		t.Errorf("Reset through a redirect to another host: %v, want it refused", err)
	}
	if leaked.Load() {
		t.Error("the credentials reached the redirect's target")
	}
}

// An http:// endpoint is refused unless the target allows it: HTTP Basic
// would send the password in cleartext. Nothing reaches the BMC.
func TestHTTPEndpointRefusedUnlessAllowed(t *testing.T) {
	var reached atomic.Bool
	bmc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Store(true) }))
	defer bmc.Close()
	err := New(Config{Timeout: 10 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: credsFile(t)})
	if !errors.Is(err, ErrCleartext) {
		t.Errorf("Reset of an http:// endpoint: %v, want ErrCleartext", err)
	}
	if reached.Load() {
		t.Error("the request reached the BMC")
	}
}

// jsonBMC serves fixed JSON answers by path (404 for others), and counts
// its requests.
func jsonBMC(t *testing.T, answers map[string]string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		body, ok := answers[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv, &requests
}

// A BMC whose Systems collection never ends, served in pages of 1 MB or
// of a few bytes, has the reset fail with the bound of the conversation
// (total bytes, or requests) after a few MiB: the pages are not followed
// without end, nor kept. Given the system's id, the reset fetches that
// system directly and never walks the collection.
func TestEndlessSystemsCollectionIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pageBytes int
		want      string
	}{
		{"1MB pages", 1_000_000, fmt.Sprintf("redfish: BMC conversation exceeded %d bytes", maxTotalBytes)},
		{"small pages", 100, fmt.Sprintf("redfish: BMC conversation exceeded %d requests", maxRequests)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bmc := redfishtest.Start(t, redfishtest.Options{EndlessSystems: tc.pageBytes})
			creds := bmc.WriteCredentials(t, t.TempDir())
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := New(Config{Timeout: 30 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: creds, AllowHTTP: true})
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrConversationBound) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Reset against an endless collection: %v, want %q", err, tc.want)
			}
			if len(err.Error()) > 1024 {
				t.Errorf("error of %d bytes", len(err.Error()))
			}
			if n := len(bmc.Requests()); n > maxRequests {
				t.Errorf("%d requests reached the BMC, want at most %d", n, maxRequests)
			}
			if len(bmc.Resets()) != 0 {
				t.Error("the BMC was reset")
			}
			// Both the client's and the test server's allocations count.
			grew := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d requests, %d KiB sent by the BMC, %d MiB allocated: %v", len(bmc.Requests()), bmc.BytesSent()>>10, grew>>20, err)
			if grew > 64<<20 {
				t.Errorf("Reset allocated %d MiB", grew>>20)
			}

			err = New(Config{Timeout: 30 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: creds, AllowHTTP: true, SystemID: "1"})
			if err != nil {
				t.Fatalf("Reset of system 1 through the endless BMC: %v", err)
			}
			if r := bmc.Resets(); len(r) != 1 {
				t.Errorf("resets %+v, want one", r)
			}
		})
	}
}

// gofish's own walk of a collection, which the provider does not use, ends
// too: the conversation refuses what is beyond its bounds, whoever asks.
func TestGofishWalkEndsAtConversationBound(t *testing.T) {
	bmc := redfishtest.Start(t, redfishtest.Options{EndlessSystems: 1_000_000})
	transport := &http.Transport{DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	u, err := url.Parse(bmc.URL)
	if err != nil {
		t.Fatal(err)
	}
	conv := newConversation(transport, u)
	api, err := gofish.ConnectContext(context.Background(), gofish.ClientConfig{
		Endpoint: bmc.URL, Username: "admin", Password: "s3cret:pass", BasicAuth: true,
		HTTPClient: &http.Client{Transport: conv},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.Service.Systems()
	if err == nil {
		t.Fatal("the walk of an endless collection ended without error")
	}
	if cause := conv.cause(context.Background(), err); !errors.Is(cause, ErrConversationBound) {
		t.Errorf("cause %v, want the conversation's bound", cause)
	}
	if b, r := conv.bytes.Load(), conv.requests.Load(); b > maxTotalBytes || r > maxRequests+1 {
		t.Errorf("%d bytes read in %d requests, want at most %d bytes", b, r, maxTotalBytes)
	}
}

// A Systems collection of thousands of members is refused once it passes
// maxSystems, without fetching any member.
func TestSystemsCollectionMembersBounded(t *testing.T) {
	var members []string
	for i := range 5000 {
		members = append(members, fmt.Sprintf(`{"@odata.id": "/redfish/v1/Systems/%d"}`, i))
	}
	bmc, requests := jsonBMC(t, map[string]string{
		"/redfish/v1/":        `{"@odata.id": "/redfish/v1/", "Systems": {"@odata.id": "/redfish/v1/Systems"}}`,
		"/redfish/v1/Systems": `{"Members": [` + strings.Join(members, ",") + `]}`,
	})
	err := New(Config{Timeout: 30 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: credsFile(t), AllowHTTP: true})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d members", maxSystems)) {
		t.Errorf("Reset against 5000 systems: %v, want the members' bound", err)
	}
	if n := requests.Load(); n != 3 {
		t.Errorf("%d requests, want 3 (root by gofish, root, collection)", n)
	}
}

// Links of the form "@host:port/..." (which gofish appends to the endpoint,
// making the endpoint's host user information) or ".other/..." lead to
// another host: every such request is refused before it is sent, and the
// other host never sees a request, let alone the BMC's credentials.
func TestLinksToAnotherHostRefused(t *testing.T) {
	other := redfishtest.StartOtherHost(t)
	otherHost := other.Host

	t.Run("reset target", func(t *testing.T) {
		bmc := redfishtest.Start(t, redfishtest.Options{ResetTarget: "@" + otherHost + "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"})
		err := New(Config{Timeout: 30 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: bmc.WriteCredentials(t, t.TempDir()), AllowHTTP: true})
		if !errors.Is(err, ErrForeignHost) || !strings.Contains(err.Error(), "leads to http://"+otherHost) {
			t.Errorf("Reset with a reset target on another host: %v, want ErrForeignHost naming it", err)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the error holds the password: %v", err)
		}
	})
	for name, link := range map[string]string{
		"member":  "@" + otherHost + "/redfish/v1/Systems/1",
		"systems": "@" + otherHost + "/redfish/v1/Systems",
	} {
		t.Run(name, func(t *testing.T) {
			systems := "/redfish/v1/Systems"
			if name == "systems" {
				systems = link
			}
			bmc, _ := jsonBMC(t, map[string]string{
				"/redfish/v1/":        `{"@odata.id": "/redfish/v1/", "Systems": {"@odata.id": "` + systems + `"}}`,
				"/redfish/v1/Systems": `{"Members": [{"@odata.id": "` + link + `"}]}`,
			})
			err := New(Config{Timeout: 30 * time.Second}).Reset(context.Background(), Target{Endpoint: bmc.URL, CredentialsFile: credsFile(t), AllowHTTP: true})
			if !errors.Is(err, ErrForeignHost) {
				t.Errorf("Reset with a %s link to another host: %v, want ErrForeignHost", name, err)
			}
		})
	}
	other.CheckUntouched(t)
}

// roundTripFunc is an http.RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The conversation sends a request only to its endpoint's scheme and host;
// a URL that an appended link turned into another host, with or without
// user information, is refused before it reaches the network.
func TestConversationSendsOnlyToItsEndpoint(t *testing.T) {
	endpoint, _ := url.Parse("https://bmc.example")
	for _, tc := range []struct {
		url  string
		sent bool
	}{
		{"https://bmc.example/redfish/v1/", true},
		{"https://BMC.example/redfish/v1/Systems", true},
		{"https://bmc.example.attacker.org/redfish/v1/Systems", false},
		{"https://bmc.example@attacker.org/redfish/v1/Systems", false},
		{"https://bmc.example:8443/redfish/v1/Systems", false},
		{"http://bmc.example/redfish/v1/Systems", false},
		{"https://user@bmc.example/redfish/v1/Systems", false},
	} {
		var sent bool
		conv := newConversation(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			sent = true
			return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
		}), endpoint)
		req, err := http.NewRequest(http.MethodGet, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conv.RoundTrip(req)
		if sent != tc.sent || (err == nil) != tc.sent || (err != nil && !errors.Is(err, ErrForeignHost)) {
			t.Errorf("%s: sent %v, error %v; want sent %v", tc.url, sent, err, tc.sent)
		}
	}
}
