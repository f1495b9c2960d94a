package bmdb

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ScanHistory scans a work_history row as the history queries select it.
func ScanHistory(row pgx.CollectableRow) (HistoryEntry, error) {
	var e HistoryEntry
	var cause *string
	var session *uuid.UUID
	var actor, role *string
	err := row.Scan(&e.ID, &e.Machine, &e.Process, &e.Event, &e.Timestamp, &cause, &session, &actor, &role)
	e.Actor = Actor{Name: deref(actor), Role: deref(role)}
	if cause != nil {
		e.Cause = *cause
	}
	if session != nil {
		e.Session = *session
	}
	return e, err
}

// History returns the history of machine in causal order.
func (db *DB) History(ctx context.Context, machine uuid.UUID) ([]HistoryEntry, error) {
	h, err := queryRows(ctx, db.pool, ScanHistory, qHistoryOfMachine, machine)
	if err != nil {
		return nil, fmt.Errorf("reading history of %s: %w", machine, err)
	}
	return h, nil
}

// HistoryAfter returns up to limit entries of all machines with an ID above
// after, in causal order: audits page through the whole history with it.
func (db *DB) HistoryAfter(ctx context.Context, after int64, limit int) ([]HistoryEntry, error) {
	h, err := queryRows(ctx, db.pool, ScanHistory, qHistoryAll, after, limit)
	if err != nil {
		return nil, fmt.Errorf("reading history: %w", err)
	}
	return h, nil
}
