package shepherdcli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdb/operator"
	"github.com/shepherd-fleet/shepherd/providers/ipmi"
	"github.com/shepherd-fleet/shepherd/providers/redfish"
	"github.com/shepherd-fleet/shepherd/providers/static"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// bmcCheckUsage documents shepherd bmc check.
const bmcCheckUsage = `shepherd bmc check -provider static -inventory FILE MACHINE... | -location PATH | -all [-o json]
    talks once to the BMC of each machine of the static inventory (as the
    daemon reads it): reads its power state, the reset types it offers and
    its firmware version, and checks the credentials, TLS and the configured
    reset type. It never acts: no power action is sent. MACHINE is a
    provider id of the inventory, or a machine's UUID, which needs the BMDB
    (-bmdb_dsn, -bmdb_dsn_file or $SHEPHERD_BMDB_DSN; with it, every row
    shows the machine's UUID); -location selects the machines whose
    location is PATH or under it (whole path components); -all every
    machine. At most 8 BMCs at a time, each bounded by -redfish_timeout or
    -ipmi_timeout. Machines without a BMC (power: ssh) are listed and
    skipped.

Exit status: 0 every check passed; 1 a check failed (RESULT names the
error class); 2 bad command line (unknown machine, no inventory).
`

// bmcCheckRow is one machine's check, the table's row and the JSON's
// element.
type bmcCheckRow struct {
	// Machine is the machine's UUID, when the BMDB was given.
	Machine string `json:"machine,omitempty"`
	static.BMCCheck
}

// runBMC runs shepherd bmc SUBCOMMAND and returns the exit status.
func (d *CLI) runBMC(args []string, stdout, stderr io.Writer) int {
	prog := d.prog()
	fs := flag.NewFlagSet(prog+" bmc check", flag.ContinueOnError)
	provider := fs.String("provider", "", "the provider whose inventory to read: static (the only one with BMCs to check)")
	cfg := static.DefaultConfig()
	fs.StringVar(&cfg.InventoryFile, "inventory", "", "the static provider's inventory file, as the daemon's -inventory")
	cfg.Redfish.RegisterFlags(fs)
	cfg.IPMI.RegisterFlags(fs)
	location := fs.String("location", "", "check the machines at this location or under it (whole path components)")
	all := fs.Bool("all", false, "check every machine of the inventory")
	output := fs.String("o", "text", "output format: text (aligned columns) or json")
	var dsnf dsnFlags
	dsnf.register(fs)
	positional, help, err := parseCLIArgs(fs, args)
	if help {
		fmt.Fprintf(stdout, "Usage: %s\nFlags:\n", renamed(prog, bmcCheckUsage))
		printDefaults(fs, prog, stdout)
		return exitOK
	}
	if err != nil {
		return reportUsage(stderr, prog, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ids, err := newBMCCheckDB(dsnf)
	if err != nil {
		return reportUsage(stderr, prog, err)
	}
	defer ids.close()
	machines, err := bmcCheckSelection(ctx, positional, *provider, cfg, *location, *all, *output, ids)
	var usage usageError
	switch {
	case errors.As(err, &usage):
		return reportUsage(stderr, prog, err)
	case err != nil:
		fmt.Fprintf(stderr, "%s bmc check: %v\n", prog, err)
		return exitFailure
	}
	rows := checkBMCs(ctx, cfg, machines)
	if err := ids.fill(ctx, rows); err != nil {
		fmt.Fprintf(stderr, "%s bmc check: %v\n", prog, err)
		return exitFailure
	}
	if err := printBMCChecks(stdout, rows, *output == "json"); err != nil {
		fmt.Fprintf(stderr, "%s bmc check: %v\n", prog, err)
		return exitFailure
	}
	for _, r := range rows {
		if r.Failed() {
			return exitFailure
		}
	}
	return exitOK
}

// bmcCheckSelection checks bmc check's command line and returns the
// inventory's machines it selects, in inventory order; every error is a
// usage error.
func bmcCheckSelection(ctx context.Context, args []string, provider string, cfg static.Config, location string, all bool, output string, ids *bmcCheckDB) ([]static.Machine, error) {
	switch {
	case len(args) == 0 || args[0] != "check":
		return nil, usagef("usage: shepherd bmc check -provider static -inventory FILE MACHINE... | -location PATH | -all (see shepherd bmc -h)")
	case provider != static.Name:
		return nil, usagef("bmc check: -provider %q: want -provider static (BMCs are in its inventory)", provider)
	case cfg.InventoryFile == "":
		return nil, usagef("bmc check: -inventory: required with -provider static")
	case output != "text" && output != "json":
		return nil, usagef("-o %q: want text or json", output)
	}
	if err := cfg.Redfish.Check(); err != nil {
		return nil, usageError{err.Error()}
	}
	if err := cfg.IPMI.Check(); err != nil {
		return nil, usageError{err.Error()}
	}
	names := args[1:]
	given := 0
	for _, b := range []bool{len(names) > 0, location != "", all} {
		if b {
			given++
		}
	}
	if given != 1 {
		return nil, usagef("bmc check: give machines, -location PATH or -all (one of them)")
	}
	inv, err := static.Load(cfg.InventoryFile)
	if err != nil {
		return nil, usagef("-inventory: %v", err)
	}
	if names, err = ids.providerIDs(ctx, inv, names); err != nil {
		return nil, err
	}
	return selectInventory(inv, names, location, all)
}

// selectInventory returns the machines of inv named (by provider id), at
// location (whole path components) or all of them.
func selectInventory(inv *static.Inventory, names []string, location string, all bool) ([]static.Machine, error) {
	var out []static.Machine
	switch {
	case all:
		return inv.Machines, nil
	case location != "":
		loc := strings.TrimRight(location, "/")
		if loc == "" {
			return nil, usagef("-location %q: it names no path component (give e.g. dc1 or dc1/rack07)", location)
		}
		for _, m := range inv.Machines {
			if m.Location == loc || strings.HasPrefix(m.Location, loc+"/") {
				out = append(out, m)
			}
		}
		if len(out) == 0 {
			return nil, usagef("-location %s: no machine of %s is there", untrusted.Line(location, 200), inv.File)
		}
		return out, nil
	}
	var unknown []string
	for _, n := range names {
		m, ok := inv.Machine(n)
		if !ok {
			unknown = append(unknown, untrusted.Line(n, 200))
			continue
		}
		if !slices.ContainsFunc(out, func(o static.Machine) bool { return o.ID == m.ID }) {
			out = append(out, *m)
		}
	}
	if len(unknown) > 0 {
		return nil, usagef("unknown machine %s: not in the inventory %s (give its provider id)", strings.Join(unknown, ", "), inv.File)
	}
	return out, nil
}

// checkBMCs checks each machine's BMC (static.CheckBMCs) and returns
// the rows in the machines' order.
func checkBMCs(ctx context.Context, cfg static.Config, machines []static.Machine) []bmcCheckRow {
	checks := static.CheckBMCs(ctx, redfish.New(cfg.Redfish), ipmi.New(cfg.IPMI), machines)
	rows := make([]bmcCheckRow, len(checks))
	for i, c := range checks {
		rows[i].BMCCheck = c
	}
	return rows
}

// printBMCChecks writes rows as a table, or as JSON.
func printBMCChecks(w io.Writer, rows []bmcCheckRow, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tPROVIDER ID\tLOCATION\tBMC\tPOWER\tRESET TYPE\tFIRMWARE\tRESULT")
	for _, r := range rows {
		reset := r.ResetType
		switch {
		case r.ResetType == "":
		case !r.ResetOK:
			reset += " (not offered: offers " + strings.Join(r.Offered, ", ") + ")"
		case r.Result == "ok":
			reset += " (OK)"
		}
		result := r.Result
		if r.Error != "" {
			result += ": " + r.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(r.Machine), r.ProviderID, dash(r.Location), dash(r.BMC), dash(r.Power), dash(reset), dash(r.Firmware), result)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// bmcCheckDB maps machines' UUIDs to the static provider's ids through
// the BMDB, when one was given (dsn not ""). It connects on first use,
// after the command line was checked.
type bmcCheckDB struct {
	dsn string
	db  *bmdb.DB
}

// bmcCheckDBTimeout bounds bmc check's database work: a few lookups.
const bmcCheckDBTimeout = 30 * time.Second

// newBMCCheckDB returns the BMDB dsnf names, unopened; its dsn is "" when
// it names none: bmc check needs one only for machines named by UUID, and
// never falls back to a demo's.
func newBMCCheckDB(dsnf dsnFlags) (*bmcCheckDB, error) {
	dsn, err := dsnf.resolve()
	return &bmcCheckDB{dsn: dsn}, err
}

// open connects, once.
func (m *bmcCheckDB) open(ctx context.Context) (*bmdb.DB, error) {
	if m.db == nil {
		db, err := bmdb.Open(ctx, m.dsn, bmdb.Options{MaxConns: 2, QuietConnections: true})
		if err != nil {
			return nil, err
		}
		m.db = db
	}
	return m.db, nil
}

func (m *bmcCheckDB) close() {
	if m.db != nil {
		m.db.Close()
	}
}

// providerIDs returns names with each UUID that is not an inventory id
// replaced by its machine's provider id, read from the BMDB. A UUID
// without the BMDB, or of no machine of the static provider, is a usage
// error.
func (m *bmcCheckDB) providerIDs(ctx context.Context, inv *static.Inventory, names []string) ([]string, error) {
	out := slices.Clone(names)
	for i, n := range names {
		id, err := uuid.Parse(n)
		if _, listed := inv.Machine(n); listed || err != nil {
			continue
		}
		if m.dsn == "" {
			return nil, usagef("machine %s: a UUID needs the BMDB (-bmdb_dsn, -bmdb_dsn_file or $%s), or give its provider id", id, envDSN)
		}
		p, err := m.provided(ctx, id)
		switch {
		case errors.Is(err, bmdb.ErrNotFound):
			return nil, usagef("unknown machine %s: not in the BMDB", id)
		case err != nil:
			return nil, err
		case p.Provider != static.Name:
			return nil, usagef("machine %s is provided by %s, not static: bmc check reads the static inventory", id, untrusted.Line(p.Provider, 64))
		}
		out[i] = p.ProviderID
	}
	return out, nil
}

// provided reads machine's provided tag.
func (m *bmcCheckDB) provided(ctx context.Context, machine uuid.UUID) (bmdb.Provided, error) {
	ctx, cancel := context.WithTimeout(ctx, bmcCheckDBTimeout)
	defer cancel()
	db, err := m.open(ctx)
	if err != nil {
		return bmdb.Provided{}, err
	}
	var p bmdb.Provided
	err = db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		p, err = tx.Provided(ctx, machine)
		return err
	})
	return p, err
}

// fill sets each row's Machine from the BMDB, when one was given.
func (m *bmcCheckDB) fill(ctx context.Context, rows []bmcCheckRow) error {
	if m.dsn == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, bmcCheckDBTimeout)
	defer cancel()
	db, err := m.open(ctx)
	if err != nil {
		return err
	}
	for i := range rows {
		found, err := operator.New(db).MachinesByProviderID(ctx, rows[i].ProviderID)
		if err != nil {
			return err
		}
		for _, p := range found {
			if p.Provider == static.Name {
				rows[i].Machine = p.Machine.String()
			}
		}
	}
	return nil
}
