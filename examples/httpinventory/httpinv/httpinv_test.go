package httpinv_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"example.com/httpinventory/httpinv"
)

// A broken inventory is an error, never a shorter list: syncing a list
// that an error cut short would remove machines that still exist.
func TestFetchRefusesBrokenInventories(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{200, `[{"id": "a", "address": "10.0.0.1"}, {"id": "b"}]`, ""},
		{200, `[]`, ""},
		{500, `[]`, "500 Internal Server Error"},
		{200, `{"machines": []}`, "not a JSON array of machines"},
		{200, `[{"id": "a"}`, "not a JSON array of machines"},
		{200, `[{"address": "10.0.0.1"}]`, "machine 0 has no id"},
		{200, `[{"id": "a"}, {"id": "a"}]`, `machine id "a" listed twice`},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		}))
		ms, err := httpinv.Fetch(context.Background(), srv.Client(), srv.URL)
		srv.Close()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Fetch of %d %s: %v", tc.status, tc.body, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Fetch of %d %s: %v, %v; want an error with %q", tc.status, tc.body, ms, err, tc.want)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		change func(*httpinv.Config)
		want   string
	}{
		{func(c *httpinv.Config) { c.URL = "" }, "-httpinventory_url: required"},
		{func(c *httpinv.Config) { c.URL = "ftp://cmdb/machines" }, "must be an http or https address"},
		{func(c *httpinv.Config) { c.URL = "http://cmdb/%zz" }, "-httpinventory_url"},
		{func(c *httpinv.Config) { c.Poll = 0 }, "-httpinventory_poll 0s: must be positive"},
		{func(c *httpinv.Config) { c.Agents.HeartbeatInterval = 0 }, "-httpinventory_heartbeat_interval 0s: must be positive"},
		{func(c *httpinv.Config) { c.Agents.AgentStartFailureRate = 2 }, "-httpinventory_agent_start_failure_rate 2"},
	} {
		cfg := httpinv.DefaultConfig()
		cfg.URL = "http://cmdb.example/machines"
		if err := cfg.Check(); err != nil {
			t.Fatalf("Check of a good configuration: %v", err)
		}
		tc.change(&cfg)
		if err := cfg.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check: %v, want %q", err, tc.want)
		}
	}
}
