package statuspage

import (
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/statuspage/statuspagetest"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// rawControls holds a character of each class that acts on a terminal or
// reorders text on a page: ESC (C0), U+009B (C1) and U+202E (a
// bidirectional override).
const rawControls = "\x1b\u009b\u202e"

// Strings from the BMDB (provider id, address, location, causes, the
// pinned host key) reach the pages with their control characters and
// bidirectional overrides escaped, not raw: html/template alone escapes
// markup only, and a U+202E would reverse a provider id on screen.
func TestBMDBControlsEscapedOnPages(t *testing.T) {
	t.Parallel()
	f := statuspagetest.NewFleet(t)
	ctx := context.Background()
	hostile := bmdb.Provided{
		Provider:   "test",
		ProviderID: "rack9-\u202e70-kcar\x1b[2J",
		Address:    "192.0.2.99\u009b31m",
		Location:   "dc1\x1b]0;title",
	}
	cause := "ssh: \x1b[31mred\u009b2J \u202eevil"
	err := f.DB.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		id, err := tx.AddMachine(ctx, hostile)
		if err != nil {
			return err
		}
		hostile.Machine = id
		// Causes are cleaned where Shepherd records them; ones written by
		// other means (a restore, a hand edit, an older release) are not.
		if _, err := tx.Exec(ctx, `INSERT INTO work_history (machine_id, process, event, session_id, failed_cause) VALUES ($1, $2, 'Failed', $3, $4)`,
			id, agentstart.Process.Name, f.Session.ID(), cause); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds) VALUES ($1, $2, now() + interval '1 hour', $3, 3600)`,
			id, agentstart.Process.Name, cause); err != nil {
			return err
		}
		_, err = tx.PinSSHHostKey(ctx, id, "ssh-ed25519 AAAA\u202e\x1b[8m\u009bhidden")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(f.DB, processes, Options{}))
	defer srv.Close()

	for _, tc := range []struct {
		path string
		want []string
	}{
		// The overview: the failure's cause and the machine's provider id.
		{"/status", []string{`ssh: \x1b[31mred\x9b2J \u202eevil`, `rack9-\u202e70-kcar\x1b[2J`}},
		// The machine's page: its tags, backoff, history and host key.
		{MachinePath(hostile.Machine), []string{
			`rack9-\u202e70-kcar\x1b[2J`, `192.0.2.99\x9b31m`, `dc1\x1b]0;title`,
			`ssh: \x1b[31mred\x9b2J \u202eevil`, `ssh-ed25519 AAAA\u202e\x1b[8m\x9bhidden`,
		}},
		// A lookup by the hostile provider id shows the query escaped.
		{"/status/machine/?id=" + url.QueryEscape("no-such\u202e\x1b"), []string{`no-such`}},
	} {
		code, _, body := get(t, srv, tc.path)
		if code != http.StatusOK && code != http.StatusNotFound {
			t.Errorf("GET %q: %d", tc.path, code)
		}
		if i := strings.IndexAny(body, rawControls); i >= 0 {
			t.Errorf("GET %q: a control character raw at byte %d: %q", tc.path, i, body[max(0, i-60):min(len(body), i+60)])
		}
		for _, want := range tc.want {
			if !strings.Contains(body, want) {
				t.Errorf("GET %q lacks %q", tc.path, want)
			}
		}
	}

	// Escaping the rendered page is sound only while the templates hold
	// no character it would change.
	err = fs.WalkDir(templateFS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		src, err := fs.ReadFile(templateFS, path)
		if err != nil {
			return err
		}
		if untrusted.Visible(string(src)) != string(src) {
			t.Errorf("template %s holds a control or formatting character: the page's escaping would change it", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if untrusted.Visible(refreshScript) != refreshScript {
		t.Errorf("the refresh script holds a control or formatting character")
	}
}
