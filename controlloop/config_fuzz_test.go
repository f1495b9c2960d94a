package controlloop_test

import (
	"flag"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/shepherd-fleet/shepherd/controlloop"
)

// FuzzParseRate checks the "interval,burst" rate flag on any input: parsing
// never panics; what it accepts is a usable limit (interval not negative,
// burst at least 1) that prints back to the same value and builds a limiter
// with that burst; surrounding spaces change nothing; and the
// -<p>_db_query_rate flag accepts exactly what ParseRate accepts, so an
// operator's typo exits with a message instead of a surprising limit.
//
// The committed corpus (testdata/fuzz/FuzzParseRate) holds the documented
// example, the unlimited form, and the edge cases: overflowing durations and
// bursts, negative and fractional values, units, missing halves, extra
// commas, whitespace and non-ASCII digits.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"250ms,8", "0,1", "1s,1", " 2h45m , 3 ", "-1s,2", "1s,0", "1s,-3", "1,1", "1.5us,4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := controlloop.ParseRate(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseRate(%q): empty error", s)
			}
			checkFlag(t, s, err, controlloop.Rate{})
			return
		}
		if r.Interval < 0 {
			t.Fatalf("ParseRate(%q) = %+v: negative interval", s, r)
		}
		if r.Burst < 1 {
			t.Fatalf("ParseRate(%q) = %+v: burst below 1", s, r)
		}
		back, err := controlloop.ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseRate(%q) = %+v, which prints as %q, which parses as %+v, %v", s, r, r.String(), back, err)
		}
		if spaced, err := controlloop.ParseRate(" \t" + s + "\n "); err != nil || spaced != r {
			t.Fatalf("ParseRate(%q) = %+v, but with surrounding spaces %+v, %v", s, r, spaced, err)
		}
		l := r.Limiter()
		if l.Burst() != r.Burst {
			t.Fatalf("ParseRate(%q) = %+v: limiter burst %d", s, r, l.Burst())
		}
		if r.Interval == 0 && l.Limit() != rate.Inf {
			t.Fatalf("ParseRate(%q) = %+v: interval 0 must mean no limit, limiter has %v/s", s, r, l.Limit())
		}
		if r.Interval > 0 && !(l.Limit() > 0) {
			t.Fatalf("ParseRate(%q) = %+v: limiter allows %v/s", s, r, l.Limit())
		}
		checkFlag(t, s, nil, r)
	})
}

// checkFlag sets s as a process's -x_db_query_rate flag and checks that the
// flag agrees with ParseRate's verdict (parseErr) and value (want).
func checkFlag(t *testing.T, s string, parseErr error, want controlloop.Rate) {
	t.Helper()
	fs := flag.NewFlagSet("fuzz", flag.ContinueOnError)
	cfg := controlloop.Config{QueryRate: controlloop.Rate{Interval: time.Second, Burst: 1}}
	cfg.RegisterFlags(fs, "x")
	err := fs.Set("x_db_query_rate", s)
	switch {
	case parseErr != nil && err == nil:
		t.Fatalf("-x_db_query_rate %q accepted (%+v), but ParseRate says %v", s, cfg.QueryRate, parseErr)
	case parseErr == nil && err != nil:
		t.Fatalf("-x_db_query_rate %q rejected (%v), but ParseRate accepts it", s, err)
	case parseErr == nil && cfg.QueryRate != want:
		t.Fatalf("-x_db_query_rate %q set %+v, ParseRate gives %+v", s, cfg.QueryRate, want)
	case parseErr != nil && !strings.Contains(err.Error(), "rate"):
		t.Fatalf("-x_db_query_rate %q: error %q does not say what is wrong", s, err)
	}
}
