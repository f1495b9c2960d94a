package main

import (
	"strings"
	"testing"
	"time"
)

// The lines of `river bench` (v0.30.1) the river scenario reads, as the
// CLI prints them; anything else is not a figure.
func TestParseRiverLine(t *testing.T) {
	cases := []struct {
		line string
		want riverLine
		ok   bool
	}{
		{"bench: jobs worked [          0 ], inserted [      50000 ], job/sec [        0.0 ] [0s]",
			riverLine{Inserted: 50000}, true},
		{"bench: jobs worked [      48123 ], inserted [      50000 ], job/sec [    24061.5 ] [2s]",
			riverLine{Worked: 48123, Inserted: 50000, JobsPerS: 24061.5, Period: 2 * time.Second}, true},
		{"bench: total jobs worked [     501234 ], total jobs inserted [     550000 ], overall job/sec [    25061.7 ], running 20.000183915s",
			riverLine{Total: true, Worked: 501234, Inserted: 550000, JobsPerS: 25061.7, Period: 20000183915 * time.Nanosecond}, true},
		// Nothing worked: River divides zero by a zero period.
		{"bench: total jobs worked [          0 ], total jobs inserted [          0 ], overall job/sec [        NaN ], running 0s",
			riverLine{Total: true}, false},
		{`time=2026-11-27T06:00:00Z level=INFO msg="bench: Minimum jobs inserted; starting iteration"`, riverLine{}, false},
		{"", riverLine{}, false},
		{"bench: jobs worked [ 12 ], inserted [ x ], job/sec [ 1.0 ] [2s]", riverLine{}, false},
	}
	for _, c := range cases {
		got, ok := parseRiverLine(c.line)
		if c.line == cases[3].line {
			// NaN parses, but never equals itself: check the rest.
			if !ok || !got.Total || got.Worked != 0 || got.JobsPerS == got.JobsPerS {
				t.Errorf("parseRiverLine(%q) = %+v, %v; want a summary with NaN job/sec", c.line, got, ok)
			}
			continue
		}
		if ok != c.ok || got != c.want {
			t.Errorf("parseRiverLine(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

// The cost table has a column per measurement and a row per table written
// by either system, blank where a system does not write it.
func TestCostTable(t *testing.T) {
	if costTable(nil) != "" {
		t.Error("no cost lines: want no table")
	}
	table := costTable([]costResult{
		{Label: "Shepherd, 16 workers, 10k machines", Unit: "cycle", Units: 1000, Seconds: 10, Xacts: 2, Statements: 6.5, ExecUs: 40, WALBytes: 900, ServerCPUUs: 120,
			Rows: map[string]rowsPerUnit{"work": {Ins: 1, Del: 1}}},
		{Label: "River (before)", Unit: "job", Units: 500, Seconds: 2, Xacts: 0.1, WALBytes: 300, ClientCPUUs: 25.5,
			Rows: map[string]rowsPerUnit{"river_job": {Ins: 1, Upd: 2}}},
	})
	lines := strings.Split(strings.TrimSpace(table), "\n")
	for _, want := range []string{
		"| per unit of work | Shepherd, 16 workers, 10k machines | River (before) |",
		"| units/s in the window | 100 | 250 |",
		"| statements (pg_stat_statements) | 6.500 | n/a |",
		"| transactions | 2.000 | 0.100 |",
		"| server CPU µs (/proc) | 120.0 | n/a |",
		"| client CPU µs (/proc) | n/a | 25.5 |",
		"| rows river_job (ins / upd / del) |  | 1.00 / 2.00 / 0.00 |",
		"| rows work (ins / upd / del) | 1.00 / 0.00 / 1.00 |  |",
	} {
		found := false
		for _, l := range lines {
			found = found || l == want
		}
		if !found {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for _, l := range lines {
		if strings.Count(l, "|") != 4 {
			t.Errorf("row %q has not 3 cells", l)
		}
	}
}
