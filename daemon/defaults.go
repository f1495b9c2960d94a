package daemon

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// The defaults of Options' fields, which the command line's flags take as
// theirs too: a program that embeds the daemon with zero Options runs as
// the command line does without flags.
const (
	// DefaultListen is Options.Listen's default (-listen): the HTTP
	// server on the loopback address, so that /status is not served to
	// the network unless asked.
	DefaultListen = "127.0.0.1:9120"
	// DefaultSessionInterval is Options.SessionInterval's default
	// (-session_interval).
	DefaultSessionInterval = 10 * time.Second
	// DefaultHistoryRetention is Options.HistoryRetention's default
	// (-history_retention).
	DefaultHistoryRetention = bmdb.DefaultHistoryRetention
	// DefaultHistoryPruneInterval is Options.HistoryPruneInterval's
	// default (-history_prune_interval).
	DefaultHistoryPruneInterval = time.Hour
	// MinHistoryRetention is the shortest retention accepted. History is
	// the audit trail that proves no machine was leased twice; a
	// retention of minutes would delete the Started events of leases
	// still running and leave nothing to audit a failure with.
	MinHistoryRetention = time.Hour
	// KeepHistoryForever as Options.HistoryRetention turns retention off
	// (-history_retention 0): work_history grows without bound. Zero is
	// the default retention, not forever, so that a program that leaves
	// the field unset prunes as the command line does.
	KeepHistoryForever time.Duration = -1
)

// applyDefaults gives opts' zero fields their defaults and refuses values
// the command line would refuse, so that an embedding program gets what
// the command line gets: each loop's definition is validated and checked
// (Definition.Check: what its flags configure), a zero runner Config is
// the definition's controlloop.DefaultConfig, and the loops' migrations
// are required current whether or not Extensions lists them.
func applyDefaults(opts *Options) error {
	if opts.Name == "" {
		opts.Name = "shepherd"
	}
	if opts.Provider.Name == "" && opts.Provider.New == nil {
		opts.Provider = sim.Definition()
	}
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir
	}
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	if opts.SessionInterval == 0 {
		opts.SessionInterval = DefaultSessionInterval
	}
	if opts.HistoryRetention == 0 {
		opts.HistoryRetention = DefaultHistoryRetention
	}
	if opts.HistoryPruneInterval == 0 {
		opts.HistoryPruneInterval = DefaultHistoryPruneInterval
	}
	switch r := opts.HistoryRetention; {
	case opts.SessionInterval < time.Second || opts.SessionInterval > time.Hour:
		return fmt.Errorf("Options.SessionInterval %s: must be between 1s and 1h", opts.SessionInterval)
	case r < 0 && r != KeepHistoryForever:
		return fmt.Errorf("Options.HistoryRetention %s: must not be negative (KeepHistoryForever keeps history forever)", r)
	case r > 0 && r < MinHistoryRetention:
		return fmt.Errorf("Options.HistoryRetention %s: must be at least %s (or KeepHistoryForever): history is the audit trail of running work", r, MinHistoryRetention)
	case opts.HistoryPruneInterval < 0:
		return fmt.Errorf("Options.HistoryPruneInterval %s: must be positive", opts.HistoryPruneInterval)
	}
	if len(opts.Loops) == 0 {
		return errors.New("no process to run")
	}
	if opts.Provider.Check != nil {
		if err := opts.Provider.Check(); err != nil {
			return fmt.Errorf("provider %s: %w", opts.Provider.Name, err)
		}
	}
	opts.Loops = slices.Clone(opts.Loops)
	opts.Extensions = slices.Clone(opts.Extensions)
	for i := range opts.Loops {
		if err := applyLoopDefaults(&opts.Loops[i], opts.SessionInterval); err != nil {
			return err
		}
		if m := opts.Loops[i].Definition.Migrations; m != nil && !slices.Contains(opts.Extensions, m) {
			opts.Extensions = append(opts.Extensions, m)
		}
	}
	return nil
}

// applyLoopDefaults validates and checks l's definition and gives its
// runner configuration the definition's defaults: all of them when the
// Config is zero (a field whose zero means "off", such as a limit, cannot
// be told from one left unset, so a Config that sets some fields starts
// from controlloop.DefaultConfig), and the session's when it names none.
func applyLoopDefaults(l *Loop, sessionInterval time.Duration) error {
	def := l.Definition
	if err := def.Validate(); err != nil {
		return err
	}
	if reflect.ValueOf(l.Config).IsZero() {
		l.Config = controlloop.DefaultConfig(def.Info)
	}
	if l.Config.Session.Interval == 0 {
		l.Config.Session.Interval = sessionInterval
	}
	if l.Config.Session.Component == "" {
		l.Config.Session.Component = controlloop.DefaultConfig(def.Info).Session.Component
	}
	if err := l.Config.Check(def.Info.Label); err != nil {
		return fmt.Errorf("process %s: %w", def.Info.Label, err)
	}
	if def.Check != nil {
		if err := def.Check(); err != nil {
			return fmt.Errorf("process %s: %w", def.Info.Label, err)
		}
	}
	return nil
}
