package statuspage

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/statuspage/statuspagetest"
)

// A process's own tags show on the machine page below Shepherd's, as text
// (a value from a machine cannot inject markup or forge lines); a process
// whose read fails shows the failure in place of its tags, and the rest of
// the page is still served.
func TestProcessTags(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	var asked []uuid.UUID
	withTags := append([]Process(nil), processes...)
	withTags[0].Tags = func(ctx context.Context, tx bmdb.Tx, m uuid.UUID) ([]Tag, error) {
		asked = append(asked, m)
		return []Tag{{Name: "Firmware", Value: "2.1.0 <b>bold</b>\nforged line"}}, nil
	}
	withTags[1].Tags = func(ctx context.Context, tx bmdb.Tx, m uuid.UUID) ([]Tag, error) {
		return nil, errors.New("table missing")
	}
	srv := httptest.NewServer(New(f.DB, withTags, Options{}))
	defer srv.Close()

	code, _, body := get(t, srv, MachinePath(f.Finished))
	if code != http.StatusOK {
		t.Fatalf("machine page: %d", code)
	}
	if len(asked) != 1 || asked[0] != f.Finished {
		t.Errorf("Tags asked for %v, want the machine of the page", asked)
	}
	for _, want := range []string{
		`<dt>Firmware</dt><dd>2.1.0 &lt;b&gt;bold&lt;/b&gt;\nforged line</dd>`,
		`<dt>recovery</dt><dd>cannot read its tags: table missing</dd>`,
		"Leases and backoffs",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("machine page lacks %q", want)
		}
	}
	if strings.Contains(body, "<b>bold</b>") {
		t.Errorf("a tag value was rendered as markup")
	}
}
