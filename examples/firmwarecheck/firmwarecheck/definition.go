package firmwarecheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"

	"example.com/firmwarecheck/firmwarecheck/migrations"
)

// Migrations is the schema of the machine_firmware table.
var Migrations = &bmdb.Extension{Name: "firmwarecheck", FS: migrations.FS}

// Definition is FirmwareCheck, stated once: a binary registers it
// (d.AddProcess(firmwarecheck.Definition())), and the command line and
// the daemon read it. A failed check is retried within minutes at first:
// a BMC that did not answer usually answers soon.
func Definition() controlloop.Definition {
	cfg := DefaultConfig()
	return controlloop.Definition{
		Info: controlloop.Info{
			Process:        Process,
			Label:          Label,
			DefaultBackoff: bmdb.Backoff{Initial: time.Minute, Maximum: 6 * time.Hour, Exponent: 2},
		},
		Candidates: func() (bmdb.Candidates, error) { return bmdb.NewCandidates(candidates) },
		Flags:      cfg.RegisterFlags,
		Check:      cfg.Check,
		New: func(env controlloop.Env) (controlloop.Handler, error) {
			checker, err := controlloop.ProviderAs[Checker](env)
			if err != nil {
				return nil, fmt.Errorf("FirmwareCheck needs a provider that reads firmware versions: %w", err)
			}
			return New(checker, cfg), nil
		},
		Tags:       Tags,
		Explain:    Explain,
		Migrations: Migrations,
		DemoFlags:  map[string]string{Label + "_period": "2m"},
	}
}

// Tags reads a machine's firmware tag for its status page and 'tags'.
func Tags(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]controlloop.Tag, error) {
	var version string
	var current bool
	var checked time.Time
	err := tx.QueryRow(ctx, `SELECT version, current, checked_at FROM machine_firmware WHERE machine_id = $1`, machine).
		Scan(&version, &current, &checked)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the firmware tag: %w", err)
	}
	state := "current"
	if !current {
		state = "outdated"
	}
	return []controlloop.Tag{
		{Name: "Firmware", Value: version + " (" + state + ")"},
		{Name: "Firmware checked", Value: checked.UTC().Format(time.RFC3339)},
	}, nil
}

// Explain returns the fact FirmwareCheck's condition reads on a machine,
// for 'shepherd explain': whether its agent heartbeats.
func Explain(ctx context.Context, tx bmdb.Tx, machine uuid.UUID) ([]bmdb.Fact, error) {
	at, err := tx.LastHeartbeat(ctx, machine)
	if errors.Is(err, bmdb.ErrNotFound) {
		return []bmdb.Fact{{Name: "agent heartbeat", Value: "none"}}, nil
	}
	if err != nil {
		return nil, err
	}
	return []bmdb.Fact{{Name: "last agent heartbeat", Value: at.UTC().Format(time.RFC3339)}}, nil
}
