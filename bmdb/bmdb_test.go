package bmdb

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

// face is every identifier the package exports. Adding one is a decision
// about what a process or provider author needs, not a side effect of
// moving code: the machinery belongs to internal/bmdb.
var face = strings.Fields(`
	Actor AgentKey Backoff BackoffState Candidates Condition
	DB ErrLeased ErrNotFound ErrUnwatchedTable Event EventCanceled EventEscalated EventFailed
	EventFinished EventHeld EventLost EventNotRecovered EventRecovered
	EventReleased EventRemoved EventRescheduled EventStarted Extension
	HistoryEntry Limits MachineBudget MaxBackoff NewCandidates NotRecovered Process
	Provided ProvidedCandidates ResetVerification SessionConfig Tx
	AgentFacts Fact LeasedMachine PendingReset Removal`)

// TestFaceIsSmall fails when the package exports an identifier that is not
// in face, or no longer exports one that is.
func TestFaceIsSmall(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			got = append(got, exported(d)...)
		}
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(face))
	for _, id := range got {
		if !slices.Contains(want, id) {
			t.Errorf("bmdb exports %s, which is not in face: is it for authors, or machinery for internal/bmdb?", id)
		}
	}
	for _, id := range want {
		if !slices.Contains(got, id) {
			t.Errorf("bmdb no longer exports %s: remove it from face", id)
		}
	}
}

func exported(d ast.Decl) []string {
	var ids []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil && d.Name.IsExported() {
			ids = append(ids, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if s.Name.IsExported() {
					ids = append(ids, s.Name.Name)
				}
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						ids = append(ids, n.Name)
					}
				}
			}
		}
	}
	return ids
}
