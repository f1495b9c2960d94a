package redfishtest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// OtherHost is a host a hostile BMC's links point to: it should never
// see a request, let alone the BMC's credentials.
type OtherHost struct {
	// Host is its host:port, to put into a link ("@HOST/redfish/v1/...").
	Host    string
	reached atomic.Int64
	sawAuth atomic.Bool
}

// StartOtherHost starts an OtherHost, stopped when the test ends.
func StartOtherHost(t testing.TB) *OtherHost {
	t.Helper()
	o := &OtherHost{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.reached.Add(1)
		if r.Header.Get("Authorization") != "" {
			o.sawAuth.Store(true)
		}
	}))
	t.Cleanup(srv.Close)
	o.Host = strings.TrimPrefix(srv.URL, "http://")
	return o
}

// CheckUntouched fails t if the host received a request.
func (o *OtherHost) CheckUntouched(t testing.TB) {
	t.Helper()
	if n := o.reached.Load(); n != 0 || o.sawAuth.Load() {
		t.Errorf("the other host received %d requests (credentials: %v)", n, o.sawAuth.Load())
	}
}
