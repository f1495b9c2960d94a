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
	"github.com/shepherd-fleet/shepherd/daemon"

	"example.com/firmwarecheck/firmwarecheck/migrations"
)

// Migrations is the schema of the machine_firmware table.
var Migrations = &bmdb.Extension{Name: "firmwarecheck", FS: migrations.FS}

// Definition registers FirmwareCheck with a daemon:
// d.AddProcess(firmwarecheck.Definition()).
func Definition() daemon.Process {
	cfg := DefaultConfig()
	return daemon.Process{
		Info:  Info(),
		Flags: cfg.RegisterFlags,
		Check: cfg.Check,
		New: func(env daemon.Env) (controlloop.Process, error) {
			checker, err := daemon.ProviderAs[Checker](env)
			if err != nil {
				return nil, fmt.Errorf("FirmwareCheck needs a provider that reads firmware versions: %w", err)
			}
			return New(checker, cfg)
		},
		Tags:       Tags,
		Migrations: Migrations,
		DemoFlags:  map[string]string{Label + "_period": "2m"},
	}
}

// Tags reads a machine's firmware tag for its status page and 'tags'.
func Tags(ctx context.Context, tx *bmdb.Tx, machine uuid.UUID) ([]daemon.Tag, error) {
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
	return []daemon.Tag{
		{Name: "Firmware", Value: version + " (" + state + ")"},
		{Name: "Firmware checked", Value: checked.UTC().Format(time.RFC3339)},
	}, nil
}
