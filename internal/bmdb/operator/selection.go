package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// StateHeld: the machine is held for the process (holds.go); listed by
// Machines and selectable by Selector.
const StateHeld State = "held"

// SelectableStates are the states a Selector takes.
var SelectableStates = []State{StateLeased, StateBackoff, StateRescheduled, StateHeld}

// joinStates lists states for a message: "leased, backoff".
func joinStates(states []State) string {
	s := make([]string, len(states))
	for i, st := range states {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

// Selector picks machines for an operator command that acts on many
// (shepherd hold, release, retry, backoff clear, cancel) instead of naming
// them. Every field set narrows the selection; at least one must be set.
type Selector struct {
	// Location selects the machines whose location at their provider is
	// Location or under it, by whole path components: "dc3/rack00" (or
	// "dc3/rack00/") selects dc3/rack00 and dc3/rack00/u07, not
	// dc3/rack000. A plain string prefix would select racks an operator
	// did not name.
	Location string
	// Process and State select the machines in that state of the process
	// (SelectableStates); State needs Process.
	Process string
	State   State
	// Cause is a substring (case-insensitive) of the last failure cause:
	// of the process's backoff on the machine when Process is set, of any
	// process's otherwise.
	Cause string
	// Released narrows the selection to the machines a Release of Process
	// would act on: those with an active hold of Process, or of any
	// process when Process is "". A release of a rack names the held
	// machines, not every machine of the rack.
	Released bool
	// Limit bounds the machines returned (default MaxHoldBatch); a
	// selection that reaches it is reported as such by the caller.
	Limit int
}

// Empty reports whether the selector selects nothing by itself.
func (s Selector) Empty() bool { return s.Location == "" && s.State == "" && s.Cause == "" }

// SelectedMachine is one machine a Selector picked.
type SelectedMachine struct {
	Machine    uuid.UUID
	ProviderID string
	Location   string
}

// SelectMachines returns the machines sel picks, by provider id. It reads
// the selected process's index (leases, backoffs, holds) or, for a
// location or cause alone, the fleet's provider rows: an operator's
// command, not a hot path.
func (db *DB) SelectMachines(ctx context.Context, sel Selector) ([]SelectedMachine, error) {
	if sel.Empty() {
		return nil, fmt.Errorf("selecting machines: give a location, a process's state or a cause")
	}
	if sel.State != "" {
		if sel.Process == "" {
			return nil, fmt.Errorf("selecting machines in state %q: of which process?", sel.State)
		}
		if !slices.Contains(SelectableStates, sel.State) {
			return nil, fmt.Errorf("selecting machines in state %q: want one of %s", sel.State, joinStates(SelectableStates))
		}
	}
	var process *string
	if sel.Process != "" {
		if err := bmdb.CheckProcessName(sel.Process); err != nil {
			return nil, err
		}
		process = &sel.Process
	}
	if sel.Limit <= 0 {
		sel.Limit = MaxHoldBatch
	}
	location, err := selectedLocation(sel.Location)
	if err != nil {
		return nil, err
	}
	args := pgx.NamedArgs{
		"location": nullIfEmpty(location),
		"process":  process,
		"state":    nullIfEmpty(string(sel.State)),
		"cause":    nullIfEmpty(sel.Cause),
		"released": sel.Released,
		"limit":    sel.Limit,
	}
	out, err := bmdb.QueryRows(ctx, db.Pool(), func(row pgx.CollectableRow) (SelectedMachine, error) {
		var m SelectedMachine
		var providerID, location *string
		err := row.Scan(&m.Machine, &providerID, &location)
		m.ProviderID, m.Location = deref(providerID), deref(location)
		return m, err
	}, qSelectMachines, args)
	if err != nil {
		return nil, fmt.Errorf("selecting machines: %w", err)
	}
	return out, nil
}

// selectedLocation is a Selector's Location as qSelectMachines compares
// it: without its trailing slashes ("dc1/rack07/" is dc1/rack07).
func selectedLocation(loc string) (string, error) {
	trimmed := strings.TrimRight(loc, "/")
	if loc != "" && trimmed == "" {
		return "", fmt.Errorf("selecting machines at location %q: it names no path component (give e.g. dc1 or dc1/rack07)", loc)
	}
	return trimmed, nil
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
