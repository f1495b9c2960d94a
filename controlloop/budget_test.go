package controlloop

import (
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

func TestParseMachineBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want bmdb.MachineBudget
	}{
		{"3/24h", bmdb.MachineBudget{N: 3, Window: 24 * time.Hour}},
		{" 1 / 90s ", bmdb.MachineBudget{N: 1, Window: 90 * time.Second}},
		{"none", bmdb.MachineBudget{}},
		{"0", bmdb.MachineBudget{}},
	} {
		got, err := ParseMachineBudget(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseMachineBudget(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "3", "0/1h", "-1/1h", "x/1h", "3/forever", "3/0s", "3/500ms", "3/2161h", "3/24h/1", "99999999999999999999/1h"} {
		if got, err := ParseMachineBudget(bad); err == nil {
			t.Errorf("ParseMachineBudget(%q) = %+v, want an error", bad, got)
		}
	}
	// The default: Recovery's comes from its Info, AgentStart's is none.
	if l := defaultLimits(Info{DefaultMachineBudget: bmdb.MachineBudget{N: 3, Window: 24 * time.Hour}}); l.MachineBudget.String() != "3/24h0m0s" {
		t.Errorf("defaultLimits: budget %s", l.MachineBudget)
	}
	if l := defaultLimits(Info{}); l.MachineBudget.Set() {
		t.Errorf("defaultLimits without a default: budget %s", l.MachineBudget)
	}
}
