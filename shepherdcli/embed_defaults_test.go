package shepherdcli

import (
	"errors"
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// A program that embeds the daemon with zero Options (but the DSN and the
// loops' definitions) runs as the command line runs without flags: the
// same history retention (not forever), HTTP address, session interval
// and runner configurations; and New checks each definition (its Check)
// as the command line does. The zero retention once kept history forever
// beside the command line's 720h.
func TestEmbeddedDefaultsAreTheCommandLines(t *testing.T) {
	t.Parallel()
	const dsn = "postgres://shepherd@db.example/bmdb"
	d := New()
	d.AddProcess(agentstart.Definition())
	d.AddProcess(recovery.Definition())
	fs := flag.NewFlagSet("shepherd", flag.ContinueOnError)
	cfg := newDaemonFlags(fs, d)
	if _, err := parseFlags(fs, nil); err != nil {
		t.Fatal(err)
	}
	cfg.noteGiven(fs)
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	cli, err := daemon.New(cfg.options(dsn, d.extensions()))
	if err != nil {
		t.Fatalf("the command line's daemon: %v", err)
	}
	embedded, err := daemon.New(daemon.Options{DSN: dsn, Loops: []daemon.Loop{
		{Definition: agentstart.Definition()}, {Definition: recovery.Definition()},
	}})
	if err != nil {
		t.Fatalf("the embedded daemon: %v", err)
	}
	c, e := cli.Options(), embedded.Options()
	if e.HistoryRetention != 30*24*time.Hour || e.HistoryRetention != c.HistoryRetention {
		t.Errorf("history retention: embedded %s, command line %s; want both 720h", e.HistoryRetention, c.HistoryRetention)
	}
	for _, f := range []struct {
		name          string
		embedded, cli any
	}{
		{"HistoryPruneInterval", e.HistoryPruneInterval, c.HistoryPruneInterval},
		{"Listen", e.Listen, c.Listen},
		{"SessionInterval", e.SessionInterval, c.SessionInterval},
		{"StateDir", e.StateDir, c.StateDir},
		{"Provider", e.Provider.Name, c.Provider.Name},
		{"Agents", e.Agents.Listen, c.Agents.Listen},
	} {
		if f.embedded != f.cli {
			t.Errorf("%s: embedded %v, command line %v", f.name, f.embedded, f.cli)
		}
	}
	if len(e.Loops) != len(c.Loops) {
		t.Fatalf("loops: embedded %d, command line %d", len(e.Loops), len(c.Loops))
	}
	for i := range e.Loops {
		if !reflect.DeepEqual(e.Loops[i].Config, c.Loops[i].Config) {
			t.Errorf("%s's runner config: embedded %+v, command line %+v", e.Loops[i].Definition.Info.Label, e.Loops[i].Config, c.Loops[i].Config)
		}
	}

	// -history_retention 0 keeps history forever, as KeepHistoryForever
	// does for an embedding program.
	if err := fs.Set("history_retention", "0"); err != nil {
		t.Fatal(err)
	}
	forever, err := daemon.New(cfg.options(dsn, d.extensions()))
	if err != nil || forever.Options().HistoryRetention != daemon.KeepHistoryForever {
		t.Errorf("-history_retention 0: %v; want KeepHistoryForever", err)
	}

	// A definition's Check, and a bad runner config or retention, are
	// refused by New as by the command line.
	bad := testDefinition("fw", "Fw")
	bad.Check = func() error { return errors.New("-fw_period 0s: must be positive") }
	for _, c := range []struct {
		opts daemon.Options
		want string
	}{
		{daemon.Options{DSN: dsn, Loops: []daemon.Loop{{Definition: bad}}}, "process fw: -fw_period 0s: must be positive"},
		{daemon.Options{DSN: dsn, Loops: []daemon.Loop{{Definition: agentstart.Definition(), Config: controlloop.Config{Parallelism: 2}}}}, "process agentstart: -agentstart_db_query_rate: burst must be at least 1"},
		{daemon.Options{DSN: dsn, Loops: []daemon.Loop{{Definition: testDefinition("Fw", "Fw")}}}, `invalid label "Fw"`},
		{daemon.Options{DSN: dsn, HistoryRetention: time.Minute, Loops: []daemon.Loop{{Definition: agentstart.Definition()}}}, "must be at least 1h0m0s"},
		{daemon.Options{DSN: dsn, HistoryRetention: -time.Hour, Loops: []daemon.Loop{{Definition: agentstart.Definition()}}}, "must not be negative"},
	} {
		if _, err := daemon.New(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New: %v, want an error with %q", err, c.want)
		}
	}
}
