package bmdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// Due-time claiming. Each registered process has a row in work_due for
// every machine that may be its candidate, with the time from which it may
// be: triggers on the tables its condition reads (shepherd_watch) make a
// written machine due now, the end of a lease makes the machine due for its
// exclusion group, and a claim that finds a machine not (yet) wanted moves
// its row to the condition's due time, or drops it. A claim then reads due
// rows by index, so its cost follows the due work, not the fleet; it
// re-checks the declared condition before leasing, which keeps the
// condition the only truth of what is a candidate.

// registrations remembers which process conditions this DB has registered
// (by fingerprint), so a claim registers once per process and condition.
type registrations struct {
	mu   sync.Mutex
	done map[string]string // process -> fingerprint
}

func (r *registrations) registered(process, fingerprint string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done[process] == fingerprint
}

func (r *registrations) forget(process string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.done, process)
}

func (r *registrations) set(process, fingerprint string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		r.done = map[string]string{}
	}
	r.done[process] = fingerprint
}

// Registration is what RegisterProcess recorded and did.
type Registration struct {
	// Watches are the tables the condition reads, whose writes make a
	// machine due for the process.
	Watches []string
	// Rebuilt is set when the process's due rows were recomputed over the
	// whole fleet: its first registration, a changed condition or
	// parameters, or a build that had not finished.
	Rebuilt bool
	// Previous names who registered the process before, with another
	// condition or parameters (empty when unchanged or new): two replicas
	// that disagree rebuild each other's rows at every start.
	Previous string
	// Building is set when another replica was building the due rows of
	// this same condition: nothing was recorded, and the process claims
	// from the rows there are until a later registration finds them
	// built.
	Building bool
	// Took is how long the registration (with a rebuild) took.
	Took time.Duration
}

// fingerprint identifies a process's condition with its effective
// parameters.
func fingerprint(c Candidates, p Process) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", p.Group(), c.Name(), c.SQL(), dueSQL(c))
	for _, k := range slices.Sorted(maps.Keys(maps.Collect(c.Args()))) {
		v, _ := c.Arg(k)
		fmt.Fprintf(h, "%s=%v\x00", k, v)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// RegisterProcess records process and its condition in the BMDB, checks
// that every table the condition reads is watched, and (re)builds the
// process's due rows when the condition or its parameters are new, or a
// build of them never finished. A runner calls it when it starts; a claim
// of a process this DB has not registered (with the same condition) fails
// with ErrNotRegistered. by names the registrant (a replica) for
// operators. While another replica builds the due rows of the same
// condition, it returns at once with Building set: claims then take the
// rows there are, and the caller registers again later, which finishes the
// build if that replica stopped before it did (controlloop's runner does).
func (db *DB) RegisterProcess(ctx context.Context, process Process, candidates Candidates, by string) (Registration, error) {
	start := time.Now()
	if err := process.Validate(); err != nil {
		return Registration{}, err
	}
	fp := fingerprint(candidates, process)
	var reg Registration
	err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		reg = Registration{}
		busy, err := lockRegistry(ctx, tx.tx, process.Name, fp)
		if err != nil || busy {
			reg.Building = busy
			return err
		}
		watches, err := conditionTables(ctx, tx.tx, candidates)
		if err != nil {
			return err
		}
		watched, err := watchedTables(ctx, tx.tx)
		if err != nil {
			return err
		}
		var unwatched []string
		for _, t := range watches {
			if _, ok := watched[t]; !ok {
				unwatched = append(unwatched, t)
			}
		}
		if len(unwatched) > 0 {
			return fmt.Errorf("%w: %s; add SELECT shepherd_watch('%s', 'INSERT', 'UPDATE', 'DELETE') to the migration that creates it",
				ErrUnwatchedTable, strings.Join(unwatched, ", "), unwatched[0])
		}
		reg.Watches = watches
		var oldFP, oldBy string
		oldBuilt := false
		err = tx.tx.QueryRow(ctx, qRegistryGet, process.Name).Scan(&oldFP, &oldBy, &oldBuilt)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if oldFP != "" && oldFP != fp {
			reg.Previous = oldBy
		}
		reg.Rebuilt = oldFP != fp || !oldBuilt
		if _, err := tx.tx.Exec(ctx, qRegistryUpsert, process.Name, process.Group(), watches,
			candidates.Name(), candidates.SQL(), dueSQL(candidates), argsJSON(candidates), fp, by, !reg.Rebuilt); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return Registration{}, fmt.Errorf("registering process %s (%s): %w", process.Name, candidates.Name(), err)
	}
	if reg.Rebuilt {
		outcome, err := db.buildDueRows(ctx, process, candidates, fp, reg.Watches)
		if err != nil {
			return Registration{}, fmt.Errorf("registering process %s (%s): building its due rows: %w", process.Name, candidates.Name(), err)
		}
		switch outcome {
		case buildElsewhere:
			reg.Rebuilt, reg.Building = false, true
		case builtElsewhere:
			reg.Rebuilt = false
		}
	}
	reg.Took = time.Since(start)
	if reg.Building {
		// The registration of this condition is recorded (by the builder):
		// claims may take the rows built so far.
		db.registered.set(process.Name, fp)
		return reg, nil
	}
	if reg.Rebuilt {
		// The rebuild may have replaced most of the table: statistics
		// from before it (an empty table, at a first start) make the
		// planner hash every due row of the process into each claim
		// instead of probing the few it locked, until autovacuum's next
		// analyze. A role that does not own the table gets a warning
		// from the server, not an error.
		if _, err := db.pool.Exec(ctx, qAnalyzeDue); err != nil {
			klog.FromContext(ctx).Error(err, "BMDB: analyzing work_due after rebuilding a process's due rows; claims may be slow until autovacuum analyzes it", "process", process.Name)
		}
	}
	db.registered.set(process.Name, fp)
	return reg, nil
}

// lockRegistry takes the registration lock of process for a registration
// of the condition with fingerprint fp. It reports busy, without waiting,
// when another replica holds the lock to build the due rows of that same
// condition: a build is a pass over the whole fleet. For anything
// else (another registration, a build of another condition) it waits, as
// registrations of one process must follow each other.
func lockRegistry(ctx context.Context, tx txConn, process, fp string) (busy bool, err error) {
	var got bool
	if err := tx.QueryRow(ctx, qRegistryTryLock, process).Scan(&got); err != nil {
		return false, err
	}
	if got {
		return false, nil
	}
	var cur string
	var built bool
	err = tx.QueryRow(ctx, qRegistryPeek, process).Scan(&cur, &built)
	switch {
	case err == nil && cur == fp && !built:
		return true, nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return false, err
	}
	_, err = tx.Exec(ctx, qRegistryLock, process)
	return false, err
}

// dueBuildChunk is how many machines one transaction of a due-row build
// covers: small enough that a chunk stays well inside the framework's
// statement timeout, and that the writes that wait for a chunk's row
// locks (a lease end in the exclusion group, a write to a watched table)
// wait less than their 5 s lock timeout, however large the fleet. The
// benchmark's claim scenario times a build (build_seconds).
const dueBuildChunk = 50000

// The outcomes of buildDueRows.
type buildOutcome int

const (
	// builtHere: this call built the due rows.
	builtHere buildOutcome = iota
	// builtElsewhere: another replica had built them from the same
	// condition.
	builtElsewhere
	// buildElsewhere: another replica holds the lock to build them, or
	// registered another condition meanwhile.
	buildElsewhere
)

// buildDueRows builds the due rows of process from the registration with
// fingerprint fp, a chunk of dueBuildChunk machines per transaction, in
// machine_id order, from where the registry says an earlier build of the
// same condition stopped; the last chunk marks the rows built. Before the
// first chunk it waits for the transactions that were writing a table the
// condition reads (watches): such a write whose trigger ran before the
// registration was visible made no due row for the process, and a chunk
// whose snapshot predated its commit would not see it either. Writes after
// the registration mark their machines due themselves. Lease and hold ends
// need no wait: the build makes a wanted machine due whether it is leased
// or held.
func (db *DB) buildDueRows(ctx context.Context, process Process, candidates Candidates, fp string, watches []string) (buildOutcome, error) {
	if err := waitForWriters(ctx, db.pool, process, watches); err != nil {
		return buildElsewhere, err
	}
	for {
		outcome, more, err := db.buildDueChunk(ctx, process, candidates, fp)
		if err != nil || !more {
			return outcome, err
		}
	}
}

// buildDueChunk builds the due rows of the next chunk of machines, in one
// transaction under the registration lock, and records how far the build
// has come; more reports that machines are left. It returns buildElsewhere
// when another replica holds the lock or registered another condition, and
// builtElsewhere when the rows are built already.
func (db *DB) buildDueChunk(ctx context.Context, process Process, candidates Candidates, fp string) (outcome buildOutcome, more bool, err error) {
	err = db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		outcome, more = buildElsewhere, false
		var got bool
		if err := tx.tx.QueryRow(ctx, qRegistryTryLock, process.Name).Scan(&got); err != nil {
			return err
		}
		if !got {
			return nil
		}
		var cur string
		var done bool
		var through *uuid.UUID
		err := tx.tx.QueryRow(ctx, qRegistryBuildProgress, process.Name).Scan(&cur, &done, &through)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case cur != fp:
			return nil
		case done:
			outcome = builtElsewhere
			return nil
		}
		after := uuid.Nil
		if through != nil {
			after = *through
		}
		var last *uuid.UUID
		chunk := dueBuildChunk
		if db.dueBuildChunk > 0 {
			chunk = db.dueBuildChunk
		}
		if err := tx.tx.QueryRow(ctx, qDueChunkEnd, after, chunk).Scan(&last); err != nil {
			return err
		}
		outcome = builtHere
		if last == nil {
			_, err := tx.tx.Exec(ctx, qRegistryBuilt, process.Name, fp)
			return err
		}
		if _, err := tx.tx.Exec(ctx, qDueChunkClear, process.Name, after, *last); err != nil {
			return err
		}
		query, args := SpliceCondition(candidates, fillDueChunkTemplate, pgx.NamedArgs{"process": process.Name, "after": after, "last": *last})
		if _, err := tx.tx.Exec(ctx, query, args); err != nil {
			return err
		}
		more = true
		_, err = tx.tx.Exec(ctx, qRegistryBuiltThrough, process.Name, fp, *last)
		return err
	})
	return outcome, more, err
}

// writerWait bounds how long a build waits for the transactions writing
// the tables its condition reads. Shepherd's own writes take milliseconds;
// a transaction left open longer (an operator's psql session) is logged,
// and its writes wait for the reconcile pass instead of the build.
const writerWait = time.Minute

// waitForWriters waits until every transaction that holds a write lock on
// one of tables, as this call starts, has ended (or writerWait passed).
// pg_locks is polled: SQL has no statement that waits for another
// transaction without blocking the table's next writers too.
func waitForWriters(ctx context.Context, q queryer, process Process, tables []string) error {
	writers, err := queryRows(ctx, q, pgx.RowTo[string], qWritersOf, tables)
	if err != nil {
		return fmt.Errorf("listing the transactions writing %s: %w", strings.Join(tables, ", "), err)
	}
	deadline := time.Now().Add(writerWait)
	for pause := time.Millisecond; len(writers) > 0; pause = min(2*pause, 100*time.Millisecond) {
		var running int
		if err := q.QueryRow(ctx, qStillRunning, writers).Scan(&running); err != nil {
			return fmt.Errorf("waiting for the transactions writing %s: %w", strings.Join(tables, ", "), err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			klog.FromContext(ctx).Info("BMDB: building due rows without waiting longer for transactions that write the tables the condition reads; their writes wait for the reconcile pass",
				"process", process.Name, "transactions", running, "waited", writerWait, "tables", tables)
			return nil
		}
		if !sleep.For(ctx, pause) {
			return ctx.Err()
		}
	}
	return nil
}

// checkRegistered returns ErrNotRegistered, wrapped with what to do, unless
// process was registered with candidates through this DB. A claim checks
// rather than registers: a registration may rebuild the process's due rows
// over the whole fleet, which is a runner's start, not a claim's.
func (db *DB) checkRegistered(process Process, candidates Candidates) error {
	if db.registered.registered(process.Name, fingerprint(candidates, process)) {
		return nil
	}
	return fmt.Errorf("%w through this DB with condition %s: call DB.RegisterProcess first, or run the process in a controlloop.Runner, which registers it at start",
		ErrNotRegistered, candidates.Name())
}

// ensureRegistered registers the process on its first use through this DB,
// for the readers (Explain, Stats) that need its due rows but are not a
// runner.
func (db *DB) ensureRegistered(ctx context.Context, process Process, candidates Candidates, by string) error {
	if db.registered.registered(process.Name, fingerprint(candidates, process)) {
		return nil
	}
	_, err := db.RegisterProcess(ctx, process, candidates, by)
	return err
}

// conditionTables names the tables a condition and its due time read, from
// the plan of a statement that evaluates them: the planner's list, not a
// parse of the SQL, so it is what the database reads.
func conditionTables(ctx context.Context, tx txConn, c Candidates) ([]string, error) {
	query, args := SpliceCondition(c, explainJSON+watchProbeTemplate, nil)
	var plan []byte
	if err := tx.QueryRow(ctx, query, args).Scan(&plan); err != nil {
		return nil, fmt.Errorf("planning the condition: %w", err)
	}
	var doc any
	if err := json.Unmarshal(plan, &doc); err != nil {
		return nil, fmt.Errorf("reading the condition's plan: %w", err)
	}
	set := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if name, ok := v["Relation Name"].(string); ok {
				set[name] = true
			}
			for _, child := range v {
				walk(child)
			}
		case []any:
			for _, child := range v {
				walk(child)
			}
		}
	}
	walk(doc)
	tables := make([]string, 0, len(set))
	for t := range set {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	return tables, nil
}

// watchedTables maps each table carrying shepherd_watch's triggers to its
// watched events.
func watchedTables(ctx context.Context, tx txConn) (map[string][]string, error) {
	rows, err := tx.Query(ctx, qWatchedTables)
	if err != nil {
		return nil, fmt.Errorf("listing watched tables: %w", err)
	}
	out := map[string][]string{}
	var name string
	var events []string
	_, err = pgx.ForEachRow(rows, []any{&name, &events}, func() error {
		out[name] = slices.Clone(events)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing watched tables: %w", err)
	}
	return out, nil
}

// NothingDue is the ErrNothingToDo of a claim that found no due machine it
// could lease: Next is when the process's next due row comes due (zero:
// none), so a claimer can sleep until then instead of polling.
type NothingDue struct {
	// Next is when the next due row comes due; zero when there is none,
	// in the past when due rows exist that this claim could not take
	// (locked by another claimer, the process paused).
	Next time.Time
	// Blocked is set when a lease limit left no room to claim.
	Blocked bool
	// More is set when the claim re-checked its round limit of due rows
	// without leasing: more may be due at once.
	More bool
}

func (e *NothingDue) Error() string { return ErrNothingToDo.Error() }

// Is makes errors.Is(err, ErrNothingToDo) hold.
func (e *NothingDue) Is(target error) bool { return target == ErrNothingToDo }

// NextDue is when process's next due row comes due (zero: none).
func (db *DB) NextDue(ctx context.Context, process Process) (time.Time, error) {
	var next *time.Time
	var registered bool
	if err := db.pool.QueryRow(ctx, qDueNext, process.Name).Scan(&next, &registered); err != nil {
		return time.Time{}, fmt.Errorf("reading the next due time of %s: %w", process.Name, err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return *next, nil
}

// ReconcileDue checks up to chunk machines after after (by id) for drift:
// machines a claim would lease now that have no due row due now. It makes
// them due and returns how many there were, and the last machine checked
// (uuid.Nil when the fleet's end was reached). A full pass costs one
// evaluation of the condition per machine, spread over as many calls as the
// caller likes.
func (db *DB) ReconcileDue(ctx context.Context, process Process, candidates Candidates, after uuid.UUID, chunk int) (last uuid.UUID, drift int64, err error) {
	if err := process.Validate(); err != nil {
		return uuid.Nil, 0, err
	}
	query, args := SpliceCondition(candidates, reconcileDueTemplate, pgx.NamedArgs{
		"group":   process.Group(),
		"process": process.Name,
		"after":   after,
		"chunk":   chunk,
	})
	var lastID *uuid.UUID
	if err := db.pool.QueryRow(ctx, query, args).Scan(&lastID, &drift); err != nil {
		return uuid.Nil, 0, fmt.Errorf("reconciling the due rows of %s: %w", process.Name, err)
	}
	if lastID == nil {
		return uuid.Nil, drift, nil
	}
	return *lastID, drift, nil
}

// ReconcilePass runs ReconcileDue over the whole fleet, chunk machines at a
// time, calling between after each statement but the last (a pause that
// spreads the pass; false stops it). It returns the statements run and the
// drift found; on an error, what was done before it.
func (db *DB) ReconcilePass(ctx context.Context, process Process, candidates Candidates, chunk int, between func() bool) (chunks int, drift int64, err error) {
	for after := uuid.Nil; ; {
		last, n, err := db.ReconcileDue(ctx, process, candidates, after, chunk)
		if err != nil {
			return chunks, drift, err
		}
		chunks++
		drift += n
		if last == uuid.Nil || !between() {
			return chunks, drift, nil
		}
		after = last
	}
}
