package redfish

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// A credentials file that group or others may read is refused, as OpenSSH
// refuses such a private key.
func TestCredentialsReadableByOthersRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(p, []byte("admin:pw-hunter2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadCredentials(p)
	if err == nil || !strings.Contains(err.Error(), "accessible by others (mode 0644)") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("ReadCredentials of a 0644 file: %v, want a refusal naming the mode (and not the password)", err)
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
