package shepherdcli

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

func TestRetentionFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // error, "" for none
		ret  time.Duration
	}{
		{nil, "", bmdb.DefaultHistoryRetention},
		{[]string{"-history_retention=2160h"}, "", 90 * 24 * time.Hour},
		{[]string{"-history_retention=0"}, "", 0},
		{[]string{"-history_retention=-1h"}, "-history_retention -1h0m0s: must not be negative (0 keeps history forever)", 0},
		{[]string{"-history_retention=10m"}, "-history_retention 10m0s: must be at least 1h0m0s", 0},
		{[]string{"-history_prune_interval=0s"}, "-history_prune_interval 0s: must be positive", 0},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		var r retentionFlags
		r.register(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		err := r.check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		case c.want != "":
			if _, ok := err.(usageError); !ok {
				t.Errorf("%v: %T is not a usage error (exit status 2)", c.args, err)
			}
		case r.retention != c.ret:
			t.Errorf("%v: retention %s, want %s", c.args, r.retention, c.ret)
		}
	}
}
