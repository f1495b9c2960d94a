// Package firmwarecheck is a Shepherd process of its own, written outside
// Shepherd's repository: for every machine whose agent heartbeats, it reads
// the machine's firmware version through the provider, at most once per
// period (24 h by default), and records it in its own tag table,
// machine_firmware.
package firmwarecheck

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
)

// Checker is what FirmwareCheck needs from the provider, beyond
// providers.Provider: a provider that can read a machine's firmware
// implements it (simfirmware does; a Redfish one would ask the BMC).
type Checker interface {
	// CheckFirmware reads the firmware version of m. It honours ctx: once
	// ctx is done the lease may be gone and it must stop.
	CheckFirmware(ctx context.Context, m bmdb.Provided) (version string, err error)
}

// Process is FirmwareCheck's identity in the BMDB. It has an exclusion
// group of its own: reading a version does not disturb AgentStart or
// Recovery, so it may run on a machine they hold.
var Process = bmdb.Process{Name: "FirmwareCheck"}

// Label names the process in flags (-firmwarecheck_...) and metrics.
const Label = "firmwarecheck"

// Config is FirmwareCheck's own configuration, set by its flags.
type Config struct {
	// Period is how long a checked machine waits for its next check.
	Period time.Duration
	// Want is the firmware version machines should run; "" accepts any.
	Want string
}

// DefaultConfig checks every machine once a day.
func DefaultConfig() Config { return Config{Period: 24 * time.Hour} }

// RegisterFlags registers -firmwarecheck_period and -firmwarecheck_want.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Period, Label+"_period", c.Period, "check a machine's firmware again this long after its last check")
	fs.StringVar(&c.Want, Label+"_want", c.Want, "the firmware version machines should run (empty: any); others are tagged outdated")
}

// Check validates the flags; its errors name the flag.
func (c *Config) Check() error {
	if c.Period < time.Second {
		return fmt.Errorf("-%s_period %s: must be at least 1s", Label, c.Period)
	}
	return nil
}

// FirmwareCheck is the process's code, a controlloop.Handler: what it does
// to one leased machine.
type FirmwareCheck struct {
	checker Checker
	cfg     Config
}

// New returns the process checking through c; cfg must have passed Check.
func New(c Checker, cfg Config) *FirmwareCheck {
	return &FirmwareCheck{checker: c, cfg: cfg}
}

// candidates are the machines whose agent heartbeats. The condition is SQL
// over machines m; machine_agent_heartbeat's primary key makes it an index
// lookup per machine. Machines checked within the period are left out by
// the framework (CheckAgainAfter), as are those leased in the process's
// exclusion group or backing off.
var candidates = bmdb.Condition{
	Name: "firmwarecheck",
	SQL:  `EXISTS (SELECT 1 FROM machine_agent_heartbeat h WHERE h.machine_id = m.machine_id)`,
}

// upsert records the firmware tag; it runs in the transaction that ends
// the lease.
const upsert = `
INSERT INTO machine_firmware (machine_id, version, current, checked_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (machine_id) DO UPDATE
SET version = excluded.version, current = excluded.current, checked_at = excluded.checked_at`

// Run implements controlloop.Handler: it reads the firmware version through
// the provider and records it when the work finishes, so that the tag is
// written if and only if the lease was still held; the machine then waits
// Period for its next check. A failed check returns the error: the runner
// backs off (with a backoff.Error's backoff, if the provider
// wrapped one).
func (f *FirmwareCheck) Run(ctx context.Context, t *controlloop.Task) error {
	m, err := t.Provided(ctx)
	if err != nil {
		return err
	}
	version, err := f.checker.CheckFirmware(ctx, m)
	if err != nil {
		return fmt.Errorf("checking firmware of %s/%s: %w", m.Provider, m.ProviderID, err)
	}
	// The version comes from the machine: bounded and cleaned before it is
	// stored.
	version = printable(version, 64)
	current := f.cfg.Want == "" || version == f.cfg.Want
	t.Commit = func(ctx context.Context, tx bmdb.Tx) error {
		_, err := tx.Exec(ctx, upsert, t.Machine, version, current)
		return err
	}
	t.CheckAgainAfter(f.cfg.Period)
	return nil
}

// printable is s from a machine made fit to store and show: valid UTF-8,
// printable characters only (no terminal escapes, no bidirectional
// overrides), at most n bytes. The status page and the CLI escape what
// they show again.
func printable(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, strings.ToValidUTF8(s, ""))
	for len(s) > n {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
