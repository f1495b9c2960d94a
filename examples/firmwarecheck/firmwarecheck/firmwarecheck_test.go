package firmwarecheck_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"

	"example.com/firmwarecheck/firmwarecheck"
)

// FirmwareCheck runs against a real PostgreSQL, like Shepherd's own
// processes: its guarantees are the database's.
func TestMain(m *testing.M) { bmdbtest.Main(m) }

// checker is a firmware checker whose answers are the test's: each
// machine's version, or an error, recorded with the time of each check.
type checker struct {
	mu     sync.Mutex
	fail   map[string]error
	checks map[string][]time.Time
}

func newChecker() *checker {
	return &checker{fail: map[string]error{}, checks: map[string][]time.Time{}}
}

func (c *checker) CheckFirmware(ctx context.Context, m bmdb.Provided) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checks[m.ProviderID] = append(c.checks[m.ProviderID], time.Now())
	if err := c.fail[m.ProviderID]; err != nil {
		return "", err
	}
	return "2.1.0", nil
}

func (c *checker) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.checks[id])
}

func (c *checker) times(id string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.checks[id]...)
}

// env is a migrated database (Shepherd's schema and FirmwareCheck's).
type env struct {
	t  *testing.T
	db bmdb.DB
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, db: bmdbtest.Open(t, bmdbtest.NewDatabase(t, firmwarecheck.Migrations))}
}

// machine adds a provided machine, with a heartbeating agent if alive.
func (e *env) machine(id string, alive bool) uuid.UUID {
	e.t.Helper()
	var m uuid.UUID
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx bmdb.Tx) error {
		var err error
		if m, err = tx.AddMachine(ctx, bmdb.Provided{Provider: "test", ProviderID: id}); err != nil || !alive {
			return err
		}
		if err := tx.SetAgentStarted(ctx, m, []byte("key")); err != nil {
			return err
		}
		return tx.Heartbeat(ctx, m)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// firmware reads machine's tag as the status page shows it.
func (e *env) firmware(m uuid.UUID) []string {
	e.t.Helper()
	var out []string
	err := e.db.Transact(context.Background(), func(ctx context.Context, tx bmdb.Tx) error {
		tags, err := firmwarecheck.Tags(ctx, tx, m)
		out = out[:0]
		for _, t := range tags {
			out = append(out, t.Name+"="+t.Value)
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// run runs FirmwareCheck with c until the test ends.
func (e *env) run(c firmwarecheck.Checker, cfg firmwarecheck.Config) *prometheus.Registry {
	e.t.Helper()
	def := firmwarecheck.Definition()
	rc := controlloop.DefaultConfig(def.Info)
	rc.IdlePoll = 50 * time.Millisecond
	rc.QueryRate = controlloop.Rate{Interval: 0, Burst: 1}
	reg := prometheus.NewRegistry()
	r, err := controlloop.NewRunner(e.db, def, firmwarecheck.New(c, cfg), rc, controlloop.NewMetrics(reg))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	return reg
}

// FirmwareCheck claims the machines whose agent heartbeats (and only
// those), records their firmware when the work finishes, and checks each
// again once its period has passed, never before.
func TestChecksAndRechecksAfterThePeriod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	alive := []uuid.UUID{e.machine("alive-0", true), e.machine("alive-1", true)}
	silent := e.machine("silent", false)
	c := newChecker()
	const period = 2 * time.Second
	e.run(c, firmwarecheck.Config{Period: period, Want: "2.1.0"})

	bmdbtest.WaitUntil(t, 30*time.Second, "a second check of every heartbeating machine", func() bool {
		return c.count("alive-0") >= 2 && c.count("alive-1") >= 2
	})
	for i, m := range alive {
		id := fmt.Sprintf("alive-%d", i)
		times := c.times(id)
		for j := 1; j < len(times); j++ {
			if gap := times[j].Sub(times[j-1]); gap < period {
				t.Errorf("%s checked again %s after its previous check, before its period %s", id, gap, period)
			}
		}
		tags := e.firmware(m)
		if len(tags) != 2 || tags[0] != "Firmware=2.1.0 (current)" {
			t.Errorf("tags of %s: %q, want Firmware=2.1.0 (current) and the check time", id, tags)
		}
		// "Check again later" is a success: Rescheduled in history, no
		// failure, no backoff.
		h, err := e.db.History(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		var rescheduled int
		for _, ev := range h {
			switch ev.Event {
			case bmdb.EventRescheduled:
				rescheduled++
			case bmdb.EventFailed:
				t.Errorf("%s: Failed in history: %s", id, ev.Cause)
			}
		}
		if rescheduled < 1 {
			t.Errorf("%s: no Rescheduled in history %+v", id, h)
		}
		if b, err := e.db.BackoffOf(context.Background(), m, firmwarecheck.Process); err != nil || b != nil {
			t.Errorf("%s: backoff %+v, %v; want none", id, b, err)
		}
	}
	if n := c.count("silent"); n != 0 {
		t.Errorf("the machine without a heartbeat was checked %d times", n)
	}
	if tags := e.firmware(silent); len(tags) != 0 {
		t.Errorf("tags of the machine without a heartbeat: %q, want none", tags)
	}
}

// A failed check records no tag, fails the work with its cause and backs
// off: by the process's default, or by the backoff its error carries.
func TestFailedCheckBacksOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	plain := e.machine("plain", true)
	custom := e.machine("custom", true)
	c := newChecker()
	c.fail["plain"] = errors.New("BMC busy")
	hour := bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 1}
	c.fail["custom"] = backoff.With(errors.New("BMC locked out"), hour)
	e.run(c, firmwarecheck.DefaultConfig())

	backoff := func(m uuid.UUID) *bmdb.BackoffState {
		b, err := e.db.BackoffOf(context.Background(), m, firmwarecheck.Process)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bmdbtest.WaitUntil(t, 30*time.Second, "both machines backing off", func() bool {
		return backoff(plain) != nil && backoff(custom) != nil
	})
	if b := backoff(plain); b.LastInterval != time.Minute || b.Cause != "checking firmware of test/plain: BMC busy" {
		t.Errorf("backoff of plain: %+v, want the default 60 s with the cause", b)
	}
	if b := backoff(custom); int64(b.LastInterval/time.Second) != 3600 {
		t.Errorf("backoff of custom: %+v, want the error's 3600 s", b)
	}
	for _, m := range []uuid.UUID{plain, custom} {
		if tags := e.firmware(m); len(tags) != 0 {
			t.Errorf("tags after a failed check: %q, want none", tags)
		}
	}
	h, err := e.db.History(context.Background(), plain)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) < 2 || h[len(h)-1].Event != bmdb.EventFailed {
		t.Errorf("history of plain: %+v, want it to end with Failed", h)
	}
	// Backing off, neither machine is checked again within the test.
	if c.count("plain") != 1 || c.count("custom") != 1 {
		t.Errorf("checks: plain %d, custom %d; want 1 each", c.count("plain"), c.count("custom"))
	}
}

// A version from the machine is stored printable and bounded: no terminal
// escape, no bidirectional override, no invalid UTF-8, at most 64 bytes.
func TestHostileVersionIsStoredClean(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.machine("hostile", true)
	hostile := "\x1b]0;owned\a2.1.0\u202e\xff" + strings.Repeat("é", 100)
	e.run(fixedVersion(hostile), firmwarecheck.Config{Period: time.Hour})
	var tags []string
	bmdbtest.WaitUntil(t, 30*time.Second, "the machine checked", func() bool {
		tags = e.firmware(m)
		return len(tags) == 2
	})
	v := strings.TrimSuffix(strings.TrimPrefix(tags[0], "Firmware="), " (current)")
	if !strings.HasPrefix(v, "]0;owned2.1.0é") || len(v) > 64 || !utf8.ValidString(v) ||
		strings.ContainsFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) {
		t.Errorf("stored version %q (%d bytes): want it printable, valid and at most 64 bytes", v, len(v))
	}
}

// Explain reports the fact the condition reads: a machine without a
// heartbeating agent has none, one with it its last heartbeat.
func TestExplainReadsTheHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	silent, alive := e.machine("silent", false), e.machine("alive", true)
	facts := func(m uuid.UUID) []bmdb.Fact {
		t.Helper()
		var out []bmdb.Fact
		err := e.db.Transact(context.Background(), func(ctx context.Context, tx bmdb.Tx) error {
			var err error
			out, err = firmwarecheck.Explain(ctx, tx, m)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := facts(silent); len(got) != 1 || got[0] != (bmdb.Fact{Name: "agent heartbeat", Value: "none"}) {
		t.Errorf("facts of a machine without an agent: %+v", got)
	}
	if got := facts(alive); len(got) != 1 || got[0].Name != "last agent heartbeat" {
		t.Errorf("facts of a machine with a heartbeating agent: %+v", got)
	}
}
