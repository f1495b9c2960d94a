package statuspage

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/google/uuid"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// The pages log through the logger of the request's context (the serving
// program's, klog.NewContext on its server's BaseContext), not klog's
// global one: failed reads of a closed BMDB reach the test's logger.
func TestPagesLogThroughTheRequestsContext(t *testing.T) {
	t.Parallel()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer()
	db := bmdbtest.NewDB(t, bmdb.Options{})
	db.Close()
	h := New(db, nil, Options{})
	for _, path := range []string{PathOverview, MachinePath(uuid.New())} {
		r := httptest.NewRequestWithContext(klog.NewContext(context.Background(), logger), http.MethodGet, path, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("%s with the BMDB closed: status %d, want %d", path, w.Code, http.StatusServiceUnavailable)
		}
	}
	data := logs.Data()
	for _, msg := range []string{"Status page: reading the overview failed", "Status page: reading the BMDB failed"} {
		if !slices.ContainsFunc(data, func(e ktesting.LogEntry) bool { return e.Message == msg }) {
			t.Errorf("%q did not reach the request's logger; it has:\n%s", msg, logs.String())
		}
	}
}
