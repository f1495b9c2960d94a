package controlloop

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// Rate is a token-bucket limit on the database queries a process's claiming
// makes: one query per Interval on average, with bursts of Burst. Its flag
// form is "interval,burst", e.g. "250ms,8"; an interval of 0 means no limit.
type Rate struct {
	Interval time.Duration
	Burst    int
}

// ParseRate parses the "interval,burst" flag form.
func ParseRate(s string) (Rate, error) {
	iv, b, ok := strings.Cut(strings.TrimSpace(s), ",")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want interval,burst (e.g. 250ms,8)", s)
	}
	interval, err := time.ParseDuration(strings.TrimSpace(iv))
	if err != nil {
		return Rate{}, fmt.Errorf("rate %q: interval: %w", s, err)
	}
	if interval < 0 {
		return Rate{}, fmt.Errorf("rate %q: interval must not be negative", s)
	}
	burst, err := strconv.Atoi(strings.TrimSpace(b))
	if err != nil {
		return Rate{}, fmt.Errorf("rate %q: burst: want a whole number", s)
	}
	if burst < 1 {
		return Rate{}, fmt.Errorf("rate %q: burst must be at least 1", s)
	}
	return Rate{Interval: interval, Burst: burst}, nil
}

func (r Rate) String() string { return fmt.Sprintf("%s,%d", r.Interval, r.Burst) }

// Limiter builds the token bucket.
func (r Rate) Limiter() *rate.Limiter {
	if r.Interval == 0 {
		return rate.NewLimiter(rate.Inf, r.Burst)
	}
	return rate.NewLimiter(rate.Every(r.Interval), r.Burst)
}

// rateValue adapts a *Rate to flag.Value.
type rateValue struct{ r *Rate }

func (v rateValue) String() string {
	if v.r == nil {
		return ""
	}
	return v.r.String()
}

func (v rateValue) Set(s string) error {
	r, err := ParseRate(s)
	if err != nil {
		return err
	}
	*v.r = r
	return nil
}

// Config is one process's runner configuration.
type Config struct {
	// Parallelism is the number of workers, i.e. of machines acted on at
	// once by this replica.
	Parallelism int
	// QueryRate limits claim queries.
	QueryRate Rate
	// IdlePoll is how long claiming waits before asking again after it found
	// nothing while it cannot be woken: through a transaction pooler (no
	// LISTEN), while its notification connection is down, or while the
	// process is paused or at a lease limit. It then bounds the reaction
	// latency and sets the idle load (one transaction per IdlePoll).
	IdlePoll time.Duration
	// SafetyPoll is how long an idle claimer that is woken by notifications
	// and by its next due time waits at most before asking anyway: the
	// bound on a wake-up that was lost. Every write the triggers see
	// notifies, and a lost LISTEN connection switches the claimer to
	// IdlePoll, so this is belt and braces, and at its default one of the
	// few transactions an idle process makes. Below IdlePoll, IdlePoll
	// applies.
	SafetyPoll time.Duration
	// ReconcileInterval is the period of the pass that checks the whole
	// fleet, in small chunks, for machines a claim would lease that have no
	// due row (drift: a write the triggers did not see). 0 disables it.
	ReconcileInterval time.Duration
	// Backoff is the default backoff of a failed lease (Run returned an
	// error).
	Backoff bmdb.Backoff
	// Session configures the process's BMDB session. Its default
	// Component is DefaultComponent: the program's name and the label.
	Session bmdb.SessionConfig
	// Program is the program's name in the commands the runner's logs
	// suggest (resume_with, release_with): an operator of a binary called
	// fleetd must be told to run fleetd. Empty: shepherd.
	Program string
	// ShutdownGrace is how long in-flight work may run after the runner's
	// context is done before it is cancelled.
	ShutdownGrace time.Duration
	// MetricsRefresh is the period of the eligible and backoff gauges'
	// queries. They are part of the idle load (two transactions per period),
	// and the eligible count costs a scan of the fleet, hence a default
	// well above IdlePoll.
	MetricsRefresh time.Duration
	// Limits are the process's safety limits (bmdb.Limits says each one's
	// purpose). The runner enforces them through the BMDB, so each holds
	// across every replica; when the circuit breaker trips, it logs why,
	// sets shepherd_process_paused{reason="breaker"} and leaves the
	// process paused until an operator runs 'shepherd resume'. Each limit's
	// zero value disables it, which is the default: the deployment
	// manifests set them for production.
	Limits bmdb.Limits
	// EndRetry is how long a worker keeps retrying to record the end of a
	// lease (Fail, Cancel) that the database refuses (a lock, a failover)
	// before it abandons its session, so that the reaper records the lease
	// as Lost: no lease stays held without a worker.
	EndRetry time.Duration
	// EndAttempt bounds one attempt to record the end of a lease.
	EndAttempt time.Duration
	// RunTimeout bounds one Run: its context's deadline. A Run that
	// returns after it (or does not return within RunGrace more) fails
	// with "run timed out after RunTimeout".
	RunTimeout time.Duration
	// RunGrace is how long past RunTimeout the worker waits for a Run
	// that ignores its context before it fails the lease and abandons
	// the Run's goroutine (runner.go, runBounded).
	RunGrace time.Duration

	backoffInitialSet, backoffMaximumSet, backoffExponentSet bool
}

// Upper bounds of the per-process flags: values beyond them do not work
// (memory for millions of workers, backoffs past any horizon) and are
// typos.
const (
	// MaxParallelism bounds -<p>_loop_parallelism.
	MaxParallelism = 4096
	// maxBackoff bounds -<p>_backoff_maximum (and so the initial one).
	maxBackoff = 90 * 24 * time.Hour
)

// DefaultBackoffJitter is the backoff jitter of a process whose
// definition sets none: each backoff ends up to a tenth of its interval
// later, at random. Without it, the machines of a fleet-wide failure (a
// switch, a database outage, a bad agent build) are all retried in the same
// second, again and again, and the retries fail for the load they make.
// The persisted interval, and so the sequence of intervals, stays exact. A
// process's -<p>_backoff_jitter=0 turns it off.
const DefaultBackoffJitter = 0.1

// DefaultProgram is Config.Program's default.
const DefaultProgram = "shepherd"

// DefaultComponent is the default name of a process's sessions: the
// program's name and the process's label ("fleetd-firmwarecheck"), so
// that the sessions of two programs sharing a BMDB tell them apart.
func DefaultComponent(program, label string) string { return program + "-" + label }

// DefaultConfig is the configuration of a process before flags.
func DefaultConfig(info Info) Config {
	backoff := info.DefaultBackoff
	if backoff.Jitter == 0 {
		backoff.Jitter = DefaultBackoffJitter
	}
	return Config{
		Parallelism: 4,
		QueryRate:   Rate{Interval: 250 * time.Millisecond, Burst: 8},
		IdlePoll:    700 * time.Millisecond,
		SafetyPoll:  10 * time.Second,

		ReconcileInterval: 10 * time.Minute,
		Backoff:           backoff,
		Session:           bmdb.SessionConfig{Component: DefaultComponent(DefaultProgram, info.Label), Interval: 10 * time.Second},
		ShutdownGrace:     10 * time.Second,
		MetricsRefresh:    30 * time.Second,
		Limits:            defaultLimits(info),
		EndRetry:          2 * time.Minute,
		EndAttempt:        30 * time.Second,
		RunTimeout:        cmp.Or(info.DefaultRunTimeout, DefaultRunTimeout),
		RunGrace:          5 * time.Second,
	}
}

// DefaultRunTimeout is the bound on one Run of a process whose Info
// declares none: generous, since it only catches a Run that hangs.
const DefaultRunTimeout = 15 * time.Minute

// maxRunTimeout bounds -<p>_run_timeout: a lease held longer than a day
// by one Run is a hang, not work.
const maxRunTimeout = 24 * time.Hour

// durationFlag records whether it was set, so that Check can tell an
// explicit bad value from a default.
type durationFlag struct {
	d   *time.Duration
	set *bool
}

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*f.d, *f.set = d, true
	return nil
}

// floatFlag is a number flag whose parse error says what number it wants
// (want). With set, it records whether it was set, as durationFlag does.
type floatFlag struct {
	f    *float64
	set  *bool
	want string
}

func (f floatFlag) String() string {
	if f.f == nil {
		return ""
	}
	return strconv.FormatFloat(*f.f, 'g', -1, 64)
}

func (f floatFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return errors.New("want " + f.want)
	}
	*f.f = v
	if f.set != nil {
		*f.set = true
	}
	return nil
}

// RegisterFlags registers the process's flags on fs, each named
// <prefix>_<name> in klog's underscore style, with the values already in c
// as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	p := prefix + "_"
	fs.IntVar(&c.Parallelism, p+"loop_parallelism", c.Parallelism, "number of "+prefix+" workers in this replica")
	fs.Var(rateValue{&c.QueryRate}, p+"db_query_rate", "limit on "+prefix+" claim queries, as interval,burst (e.g. 250ms,8; interval 0 = unlimited)")
	fs.DurationVar(&c.IdlePoll, p+"idle_poll", c.IdlePoll, "how often "+prefix+" looks for work while it has none (bounds reaction latency and idle load)")
	fs.DurationVar(&c.SafetyPoll, p+"safety_poll", c.SafetyPoll, "how often an idle "+prefix+" looks for work even though no notification woke it (bounds a lost wake-up)")
	fs.DurationVar(&c.ReconcileInterval, p+"reconcile_interval", c.ReconcileInterval, "period of the pass that checks the fleet for "+prefix+" candidates without a due row (0 disables it)")
	fs.Var(durationFlag{&c.Backoff.Initial, &c.backoffInitialSet}, p+"backoff_initial", "first backoff after a "+prefix+" failure (at least 1s)")
	fs.Var(durationFlag{&c.Backoff.Maximum, &c.backoffMaximumSet}, p+"backoff_maximum", "longest backoff after repeated "+prefix+" failures (at least the initial backoff)")
	fs.Var(floatFlag{f: &c.Backoff.Exponent, set: &c.backoffExponentSet, want: "a number"}, p+"backoff_exponent", "factor between consecutive "+prefix+" backoffs (at least 1; 1 = constant)")
	fs.DurationVar(&c.RunTimeout, p+"run_timeout", c.RunTimeout, "bound on one "+prefix+" run (its context's deadline); a run past it fails with \"run timed out after D\"")
	fs.Float64Var(&c.Backoff.Jitter, p+"backoff_jitter", c.Backoff.Jitter, "fraction of the backoff added at random to its end, so that a fleet-wide failure does not return in one wave (0..1)")
	registerLimitFlags(&c.Limits, fs, prefix)
}

// Check validates the configuration; its errors name the flag.
func (c *Config) Check(prefix string) error {
	p := "-" + prefix + "_"
	switch {
	case c.Parallelism < 1:
		return fmt.Errorf("%sloop_parallelism %d: must be at least 1", p, c.Parallelism)
	case c.Parallelism > MaxParallelism:
		return fmt.Errorf("%sloop_parallelism %d: must be at most %d (each worker holds a goroutine and a lease; more replicas scale further)", p, c.Parallelism, MaxParallelism)
	case c.IdlePoll > time.Hour:
		return fmt.Errorf("%sidle_poll %s: must be at most 1h", p, c.IdlePoll)
	case c.Backoff.Maximum > maxBackoff:
		return fmt.Errorf("%sbackoff_maximum %s: must be at most %s", p, c.Backoff.Maximum, maxBackoff)
	case c.Backoff.Exponent > 100:
		return fmt.Errorf("%sbackoff_exponent %g: must be at most 100", p, c.Backoff.Exponent)
	case c.QueryRate.Burst < 1:
		return fmt.Errorf("%sdb_query_rate: burst must be at least 1", p)
	case c.IdlePoll <= 0:
		return fmt.Errorf("%sidle_poll %s: must be positive", p, c.IdlePoll)
	case c.SafetyPoll <= 0 || c.SafetyPoll > time.Hour:
		return fmt.Errorf("%ssafety_poll %s: must be positive and at most 1h", p, c.SafetyPoll)
	case c.ReconcileInterval < 0 || (c.ReconcileInterval > 0 && c.ReconcileInterval < time.Minute) || c.ReconcileInterval > 7*24*time.Hour:
		return fmt.Errorf("%sreconcile_interval %s: must be 0 (off) or between 1m and 168h", p, c.ReconcileInterval)
	case c.backoffExponentSet && !(c.Backoff.Exponent >= 1):
		return fmt.Errorf("%sbackoff_exponent %g: must be at least 1", p, c.Backoff.Exponent)
	case c.backoffInitialSet && c.Backoff.Initial < time.Second:
		return fmt.Errorf("%sbackoff_initial %s: must be at least 1s", p, c.Backoff.Initial)
	case c.Backoff.Maximum < c.Backoff.Initial:
		return fmt.Errorf("%sbackoff_maximum %s: must not be below %sbackoff_initial %s", p, c.Backoff.Maximum, p, c.Backoff.Initial)
	case c.RunTimeout <= 0 || c.RunTimeout > maxRunTimeout:
		return fmt.Errorf("%srun_timeout %s: must be positive and at most %s", p, c.RunTimeout, maxRunTimeout)
	case c.Backoff.Jitter < 0 || c.Backoff.Jitter > 1:
		return fmt.Errorf("%sbackoff_jitter %g: must be between 0 and 1", p, c.Backoff.Jitter)
	}
	return checkLimits(&c.Limits, prefix)
}
