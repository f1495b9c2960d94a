package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// MachinesByProviderID finds the machines whose provider id is providerID,
// in any provider, so that operators can name a machine as its provider
// knows it ("sim-0002", a hostname) instead of by UUID. Several providers
// may use the same id: the caller decides what an ambiguous name means.
func (db *DB) MachinesByProviderID(ctx context.Context, providerID string) ([]bmdb.Provided, error) {
	found, err := bmdb.QueryRows(ctx, db.Pool(), bmdb.ScanProvided, qMachinesByProviderID, providerID)
	if err != nil {
		return nil, fmt.Errorf("looking up provider id %q: %w", providerID, err)
	}
	return found, nil
}

// FleetMachine is a provided machine with its tags and what the processes
// are doing with it: the row of an operator's whole-fleet listing.
type FleetMachine struct {
	bmdb.Provided
	// AgentStarted and LastHeartbeat are zero when the machine has none.
	AgentStarted  time.Time
	LastHeartbeat time.Time
	// Leased and BackingOff name the processes that hold a lease on the
	// machine or back off from it now; Rescheduled those that are to check
	// it again later (StateRescheduled).
	Leased      []string
	BackingOff  []string
	Rescheduled []string
}

// FleetQuery pages through the fleet in (provider, provider id) order.
type FleetQuery struct {
	// AfterProvider and AfterProviderID continue a listing after that
	// machine; zero values start at the beginning.
	AfterProvider, AfterProviderID string
	// Limit bounds the rows returned (default 1000).
	Limit int
}

// Fleet lists provided machines with their tags and per-process state, by
// provider and provider id, reading one index range.
func (db *DB) Fleet(ctx context.Context, q FleetQuery) ([]FleetMachine, error) {
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	out, err := bmdb.QueryRows(ctx, db.Pool(), scanFleetMachine, qFleet, q.AfterProvider, q.AfterProviderID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("listing the fleet: %w", err)
	}
	return out, nil
}

// EligibleAmong returns which of machines a claim of process could lease
// now, by candidates and the generic half of claiming: the eligible state
// of a page of a listing, without walking the fleet.
func (db *DB) EligibleAmong(ctx context.Context, process bmdb.Process, candidates bmdb.Candidates, machines []uuid.UUID) (map[uuid.UUID]bool, error) {
	if err := process.Validate(); err != nil {
		return nil, err
	}
	query, args := bmdb.SpliceCondition(candidates, eligibleAmongTemplate, pgx.NamedArgs{
		"group":   process.Group(),
		"process": process.Name,
		"ids":     machines,
	})
	ids, err := bmdb.QueryRows(ctx, db.Pool(), pgx.RowTo[uuid.UUID], query, args)
	if err != nil {
		return nil, fmt.Errorf("checking eligibility for %s: %w", process.Name, err)
	}
	out := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

func scanFleetMachine(row pgx.CollectableRow) (FleetMachine, error) {
	var m FleetMachine
	var started, heartbeat *time.Time
	err := row.Scan(&m.Machine, &m.Provider, &m.ProviderID, &m.Address, &m.Location, &m.Power, &started, &heartbeat, &m.Leased, &m.BackingOff, &m.Rescheduled)
	if started != nil {
		m.AgentStarted = *started
	}
	if heartbeat != nil {
		m.LastHeartbeat = *heartbeat
	}
	return m, err
}
