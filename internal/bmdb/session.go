package bmdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"k8s.io/klog/v2"

	bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"
)

// SessionConfig describes a worker session: the public package's type,
// which the machinery uses as it is.
type SessionConfig = bmdbapi.SessionConfig

// sessionDefaults is c with its defaults applied.
func sessionDefaults(c SessionConfig) SessionConfig {
	if c.Component == "" {
		c.Component = "shepherd"
	}
	if c.RuntimeInfo == "" {
		host, _ := os.Hostname()
		c.RuntimeInfo = fmt.Sprintf("host=%s pid=%d", host, os.Getpid())
	}
	if c.Interval <= 0 {
		c.Interval = 10 * time.Second
	}
	c.Interval = time.Duration(ceilSeconds(c.Interval)) * time.Second
	if c.Margin <= 0 || c.Margin >= c.Interval/2 {
		c.Margin = c.Interval / 5
	}
	return c
}

// Session is a heartbeating worker session: the owner of leases. A
// session is lost when a heartbeat finds it expired in the database or when
// its local deadline passes without a successful heartbeat, which happens
// before the database would let anyone reap it. Once lost, every context
// bound to it is cancelled and every operation returns ErrSessionExpired: a
// partitioned worker stops acting before another can start.
type Session struct {
	db  *DB
	id  uuid.UUID
	cfg SessionConfig

	// localDeadline is when the owner gives up on the session unless a
	// heartbeat succeeds first; checked on every transaction, so that a
	// process resumed after a freeze notices before its timer goroutine runs.
	localDeadline atomic.Pointer[time.Time]

	// logger is the logger of StartSession's context: the heartbeat
	// outlives that context, and logs (and reaps) through this one.
	logger klog.Logger

	lost     chan struct{}
	lostOnce sync.Once
	// onLoss are the cancel functions of the contexts bound to the
	// session (Bind, Lease.Bind), called when it is lost or closed.
	onLoss lossWatchers
	// silence stops the pokes and reaps (StopHeartbeat), silenced confirms
	// it; stop ends the heartbeat goroutine (Close), stopped confirms it.
	silence     chan struct{}
	silenceOnce sync.Once
	silenced    chan struct{}
	stop        chan struct{}
	stopOnce    sync.Once
	stopped     chan struct{}

	// ends group-commits the ends of the session's concurrent leases.
	ends endBatcher
	// bound are the leases whose work runs under Lease.Bind, which an
	// operator's cancel request reaches (control.go).
	bound boundLeases
}

// StartSession creates a session and starts its heartbeat. ctx bounds only
// the creation; the heartbeat runs until Close or until the session is lost.
func (db *DB) StartSession(ctx context.Context, cfg SessionConfig) (*Session, error) {
	cfg = sessionDefaults(cfg)
	s := &Session{
		db:       db,
		id:       uuid.New(),
		cfg:      cfg,
		logger:   klog.FromContext(ctx),
		lost:     make(chan struct{}),
		silence:  make(chan struct{}),
		silenced: make(chan struct{}),
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	sent := time.Now()
	err := db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		_, err := tx.tx.Exec(ctx, qSessionInsert, s.id, cfg.Component, cfg.RuntimeInfo, int32(cfg.Interval/time.Second))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("starting BMDB session for %s: %w", cfg.Component, err)
	}
	db.metrics.sessionStarted(cfg.Component)
	db.pokeResult(cfg.Component, nil)
	deadline := sent.Add(cfg.Interval - cfg.Margin)
	s.localDeadline.Store(&deadline)
	go s.heartbeat(deadline)
	// After the session's first transaction, so that the probe's
	// connections go to the host that answered it, and while the session
	// heartbeats.
	db.chooseStatements(ctx)
	return s, nil
}

// ID is the session's identifier in the sessions table and in history.
func (s *Session) ID() uuid.UUID { return s.id }

// param is the session's id as a statement parameter. pgx encodes a
// uuid.UUID through its driver.Valuer (a string, parsed back), after a
// failed attempt that builds an error each time; a pgtype.UUID it encodes
// directly. The statements of every claim and lease end take it.
func (s *Session) param() pgtype.UUID { return pgtype.UUID{Bytes: s.id, Valid: true} }

// Done is closed when the session is lost or closed.
func (s *Session) Done() <-chan struct{} { return s.lost }

// Bind returns a context that is cancelled (with cause ErrSessionExpired)
// when the session is lost or closed, or when parent is done. Work under a
// lease runs under such a context, so that it stops when the lease may no
// longer be its. Call the returned function when the work is done: until
// then the session keeps the context's cancel function.
func (s *Session) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	release := s.cancelOnLoss(cancel)
	return ctx, func() {
		release()
		cancel(context.Canceled)
	}
}

// cancelOnLoss arranges for cancel to be called with ErrSessionExpired
// when the session is lost or closed, or calls it now if the session is
// already lost or past its local deadline: work must not start under it.
// The returned function undoes the arrangement. It binds a context to the
// session without a goroutine per context: every lease's work is bound,
// on the path each cycle takes.
func (s *Session) cancelOnLoss(cancel context.CancelCauseFunc) (release func()) {
	// Alive before the lock: past the local deadline it marks the session
	// lost, which takes the lock.
	if !s.Alive() {
		cancel(ErrSessionExpired)
		return func() {}
	}
	w := &s.onLoss
	w.mu.Lock()
	if w.fired {
		w.mu.Unlock()
		cancel(ErrSessionExpired)
		return func() {}
	}
	if w.m == nil {
		w.m = map[uint64]context.CancelCauseFunc{}
	}
	id := w.next
	w.next++
	w.m[id] = cancel
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.m, id)
		w.mu.Unlock()
	}
}

// lossWatchers are the cancel functions a session calls when it is lost
// or closed (Session.cancelOnLoss).
type lossWatchers struct {
	mu    sync.Mutex
	fired bool
	next  uint64
	m     map[uint64]context.CancelCauseFunc
}

// markLost closes s.lost and cancels every context bound to the session,
// once, first calling announce (unless nil); later calls do nothing.
func (s *Session) markLost(announce func()) {
	s.lostOnce.Do(func() {
		if announce != nil {
			announce()
		}
		close(s.lost)
		w := &s.onLoss
		w.mu.Lock()
		w.fired = true
		m := w.m
		w.m = nil
		w.mu.Unlock()
		for _, cancel := range m {
			cancel(ErrSessionExpired)
		}
	})
}

// Transact runs fn in a transaction whose first statement checks that the
// session is alive; see DB.Transact for retries. It returns
// ErrSessionExpired, without running fn, once the session is gone.
func (s *Session) Transact(ctx context.Context, fn func(ctx context.Context, tx *Tx) error) error {
	return s.db.transact(ctx, s, s.db.begin, checkFirst, fn)
}

// aliveWith checks, in transaction tx, that the session is alive (by the
// statement check: qSessionAlive, or qSessionAliveToClaim for a claim), and
// runs the statement sql (unless "") with args in the same round trip: a
// pgx batch, whose statements the server runs in order in the
// transaction, after the transaction's BEGIN when it is the first
// (pipelinedTx). A claim and a batch of lease ends each save round trips
// this way, on the path every cycle takes. A session found gone is marked
// expired and reported as ErrSessionExpired, whatever sql did: the caller
// rolls back. A failed check is a *notStartedError (nothing was done that
// a commit would keep); the failure of sql, or of read, which reads its
// rows, is returned as it is.
func (s *Session) aliveWith(ctx context.Context, tx txConn, check, sql string, args []any, read func(pgx.Rows) error) error {
	var alive bool
	var checkErr, readErr error
	b := &pgx.Batch{}
	b.Queue(check, s.param()).QueryRow(func(row pgx.Row) error {
		var one int
		checkErr = row.Scan(&one)
		alive = checkErr == nil
		if errors.Is(checkErr, pgx.ErrNoRows) {
			checkErr = nil
		}
		return checkErr
	})
	if sql != "" {
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			readErr = read(rows)
			rows.Close()
			if readErr == nil {
				readErr = rows.Err()
			}
			return readErr
		})
	}
	err := tx.SendBatch(ctx, b).Close()
	switch {
	case checkErr != nil:
		return &notStartedError{fmt.Errorf("checking BMDB session: %w", checkErr)}
	case err != nil && !alive && readErr == nil:
		return &notStartedError{fmt.Errorf("checking BMDB session: %w", err)}
	case !alive:
		s.markExpired()
		return ErrSessionExpired
	case readErr != nil:
		return readErr
	}
	return err
}

// expired reports whether the session is lost, marking it lost when its
// local deadline has passed.
func (s *Session) expired() bool {
	select {
	case <-s.lost:
		return true
	default:
	}
	if time.Now().After(*s.localDeadline.Load()) {
		s.markExpired()
		return true
	}
	return false
}

// Alive reports whether the owner may still act under the session: it has
// not been lost and its local deadline has not passed. Process code about to
// act on the world can check it as a last fence.
func (s *Session) Alive() bool { return !s.expired() }

func (s *Session) markExpired() {
	s.markLost(func() {
		s.logger.Error(ErrSessionExpired, "BMDB session lost: cancelling all work under it", "session", s.id, "component", s.cfg.Component)
		s.db.metrics.sessionExpired(s.cfg.Component)
	})
}

// StopHeartbeat stops poking the session (and reaping others) without
// closing it, as if its owner were cut off from the database: the session
// expires in the database after its interval, and its owner loses it at the
// local deadline, before that (Done closes, bound contexts are cancelled).
// No poke is sent once it returns. Tests use it to simulate a crashed or
// partitioned owner.
func (s *Session) StopHeartbeat() {
	s.silenceOnce.Do(func() { close(s.silence) })
	select {
	case <-s.silenced:
	case <-s.stopped:
	}
}

// Abandon gives the session up without closing it: no more pokes, and its
// owner loses it at once (Done closes, bound contexts are cancelled). Its
// leases stay in the database until the session expires there, when a
// reaper releases them and records each as Lost. An owner abandons a
// session whose lease it cannot end (the database refuses the end for
// longer than it may wait): the reaper is then the one that ends it, so
// that no lease stays held without a worker.
func (s *Session) Abandon() {
	s.StopHeartbeat()
	s.markExpired()
}

// halt ends the heartbeat goroutine, local deadline included.
func (s *Session) halt() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.stopped
}

// heartbeat pokes the session every Interval/2 and reaps expired sessions
// when a poke finds one (or every ReapInterval, if set), until silenced, and
// loses the session at its local deadline, until halted or lost.
func (s *Session) heartbeat(localDeadline time.Time) {
	defer close(s.stopped)
	// ctx bounds the heartbeat's queries: they stop with the pokes. It
	// carries the session's logger to the reaps and cancel checks.
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), s.logger))
	reapDone := make(chan struct{})
	defer func() { cancel(); <-reapDone }()
	go func() {
		select {
		case <-s.stop:
		case <-s.silence:
		case <-s.lost:
		}
		cancel()
	}()
	// Reaping runs beside the pokes, never in their way: a reap may wait on
	// a lease row that a transaction of a partitioned replica still locks
	// (until the server ends it, see Options.IdleInTransactionTimeout), and
	// pokes stuck behind it would cost this healthy replica its own session,
	// and the next reaper its own, one replica after another.
	reapNow := make(chan struct{}, 1)
	go s.reapWhenDue(ctx, reapNow, reapDone)

	deadline := time.NewTimer(time.Until(localDeadline))
	defer deadline.Stop()
	poke := time.NewTimer(s.cfg.Interval / 2)
	defer poke.Stop()
	silence := s.silence
	var lastEndedReap time.Time

	for {
		select {
		case <-s.stop:
			return
		case <-s.lost:
			return
		case <-silence:
			silence = nil
			poke.Stop()
			<-reapDone // ctx is cancelled on silence
			close(s.silenced)
		case <-deadline.C:
			s.logger.Error(ErrSessionExpired, "BMDB session lost: no successful heartbeat before the local deadline", "session", s.id, "component", s.cfg.Component)
			s.markExpired()
			return
		case <-poke.C:
			sent := time.Now()
			alive, othersExpired, ended, cancels, err := s.poke(ctx, localDeadline)
			switch {
			case ctx.Err() != nil:
				// Silenced, halted or lost meanwhile: the next round sees which.
			case err != nil:
				s.logger.Error(err, "BMDB session heartbeat failed, retrying", "session", s.id, "component", s.cfg.Component)
				poke.Reset(min(time.Second, s.cfg.Interval/10))
			case !alive:
				s.markExpired()
				return
			default:
				localDeadline = sent.Add(s.cfg.Interval - s.cfg.Margin)
				next := localDeadline
				s.localDeadline.Store(&next)
				deadline.Reset(time.Until(localDeadline))
				poke.Reset(s.cfg.Interval / 2)
				if cancels {
					// An operator's cancel request whose notification
					// this replica missed (or a stale one to forget).
					s.checkCancelsAsync(ctx)
				}
				// A session that ended in the last minutes may have
				// left a lease (qLeasesOrphaned): a reap looks, now
				// and then, until the ended sessions are forgotten.
				if ended && time.Since(lastEndedReap) >= endedReapInterval {
					othersExpired, lastEndedReap = true, time.Now()
				}
				if othersExpired {
					select {
					case reapNow <- struct{}{}:
					default: // a reap is already asked for
					}
				} else {
					// Nothing left to reap (another replica may have
					// reaped it): an earlier failed reap no longer
					// holds readiness down.
					s.db.nothingToReap()
				}
			}
		}
	}
}

// reapWhenDue reaps expired sessions whenever reapNow says a heartbeat
// found one (and every ReapInterval, if set) until ctx is done, then closes
// done.
func (s *Session) reapWhenDue(ctx context.Context, reapNow <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var tick <-chan time.Time
	if s.cfg.ReapInterval > 0 {
		t := time.NewTicker(s.cfg.ReapInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-reapNow:
		case <-tick:
		}
		_, _, err := s.db.Reap(ctx)
		if ctx.Err() == nil {
			s.db.reapResult(err)
		}
		if err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "BMDB: reaping expired sessions failed", "session", s.id)
		}
	}
}

// poke extends the session's deadline; it reports false when the session
// was already expired in the database, whether any other session is,
// whether a session ended in the last minutes (sessions_ended), and
// whether an operator's cancel request names one of its leases.
func (s *Session) poke(ctx context.Context, localDeadline time.Time) (alive, othersExpired, ended, cancels bool, err error) {
	ctx, cancel := context.WithDeadline(ctx, localDeadline)
	defer cancel()
	err = s.db.pool.QueryRow(ctx, qSessionPoke, s.id).Scan(&othersExpired, &ended, &cancels)
	alive = err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	s.db.metrics.transaction(map[bool]string{true: "committed", false: "failed"}[err == nil])
	if !errors.Is(err, context.Canceled) {
		s.db.pokeResult(s.cfg.Component, err)
	}
	if err != nil {
		return false, false, false, false, fmt.Errorf("poking session: %w", err)
	}
	return alive, othersExpired, ended, cancels, nil
}

// Close ends the session: it stops the heartbeat, releases the leases still
// held (each recorded as Canceled) and deletes the session. Callers should
// first end their leases themselves; Close is the safety net. Closing a lost
// session only stops its heartbeat: the reaper records its leases as Lost.
func (s *Session) Close(ctx context.Context) error {
	s.halt()
	if s.expired() {
		return nil
	}
	defer s.markLost(nil)
	err := s.db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		var one int
		err := tx.tx.QueryRow(ctx, qSessionOwnLock, s.id).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // already reaped
		}
		if err != nil {
			return err
		}
		ids := []uuid.UUID{s.id}
		if _, err := tx.tx.Exec(ctx, qLeasesRelease, ids, EventCanceled, "session closed"); err != nil {
			return err
		}
		if _, err := tx.tx.Exec(ctx, qSessionsEndedPrune); err != nil {
			return err
		}
		_, err = tx.tx.Exec(ctx, qSessionsDelete, ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("closing BMDB session %s: %w", s.id, err)
	}
	return nil
}

// endedReapInterval is how often a session's heartbeat starts a reap while
// sessions_ended is not empty, for the leases an ended session may have
// left: a transaction a minute per live session, for the ten minutes
// after a session ends.
const endedReapInterval = time.Minute

// Backoff after a lease is lost with its session again (a second loss, or
// a loss after a failure, with no success in between): LostBackoffInitial,
// doubling with each further loss, up to LostBackoffMaximum. A first loss
// backs nothing off: most are one replica's restart. Fixed, since the
// reaper does not know the process's own backoff.
const (
	LostBackoffInitial = time.Minute
	LostBackoffMaximum = time.Hour
)

// Reap deletes expired sessions (of any owner), releasing their leases,
// recording each release as a Lost event and, when the machine's leases
// keep being lost, backing the process off it (see LostBackoffInitial). Every live session runs it
// when a heartbeat finds something to reap; concurrent reapers skip each
// other's rows. It releases the same way the leases of sessions that no
// longer exist, which a claim by a binary of the schema before migration
// 0024 can leave (see qLeasesOrphaned); leases counts both.
func (db *DB) Reap(ctx context.Context) (sessions, leases int, err error) {
	var orphaned int
	err = db.Transact(ctx, func(ctx context.Context, tx *Tx) error {
		sessions, leases, orphaned = 0, 0, 0
		ids, err := queryRows(ctx, tx.tx, pgx.RowTo[uuid.UUID], qSessionsExpiredLock)
		if err != nil {
			return err
		}
		gone, err := queryRows(ctx, tx.tx, pgx.RowTo[uuid.UUID], qLeasesOrphaned)
		if err != nil {
			return err
		}
		var processes []string
		release := func(of []uuid.UUID, cause string) (int, error) {
			if len(of) == 0 {
				return 0, nil
			}
			released, err := queryRows(ctx, tx.tx, pgx.RowTo[string], qLeasesReap, of, cause,
				int64(LostBackoffInitial/time.Second), int64(LostBackoffMaximum/time.Second))
			processes = append(processes, released...)
			return len(released), err
		}
		if _, err := release(ids, "session expired: the worker's replica stopped, crashed or was cut off"); err != nil {
			return err
		}
		if orphaned, err = release(gone, "session gone: the lease was committed as its session was reaped"); err != nil {
			return err
		}
		leases = len(processes)
		if leases > 0 {
			if _, err := tx.tx.Exec(ctx, qNotifyDue, processes); err != nil {
				return err
			}
		}
		if _, err := tx.tx.Exec(ctx, qSessionsEndedPrune); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		tag, err := tx.tx.Exec(ctx, qSessionsDelete, ids)
		sessions = int(tag.RowsAffected())
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("reaping expired BMDB sessions: %w", err)
	}
	if sessions > 0 {
		klog.FromContext(ctx).Info("Reaped expired BMDB sessions", "sessions", sessions, "leases_released", leases-orphaned)
	}
	if orphaned > 0 {
		klog.FromContext(ctx).Info("Released leases of BMDB sessions that no longer exist", "leases_released", orphaned)
	}
	db.metrics.reaped(sessions, leases)
	return sessions, leases, nil
}

// SessionInfo is a row of the sessions table, for operators.
type SessionInfo struct {
	ID          uuid.UUID
	Component   string
	RuntimeInfo string
	Created     time.Time
	Interval    time.Duration
	Deadline    time.Time
	Alive       bool
}

// Sessions lists all sessions, live and expired but not yet reaped.
func (db *DB) Sessions(ctx context.Context) ([]SessionInfo, error) {
	ss, err := queryRows(ctx, db.pool, scanSessionInfo, qSessionsList)
	if err != nil {
		return nil, fmt.Errorf("listing sessions: %w", err)
	}
	return ss, nil
}

func scanSessionInfo(row pgx.CollectableRow) (SessionInfo, error) {
	var si SessionInfo
	var seconds int32
	err := row.Scan(&si.ID, &si.Component, &si.RuntimeInfo, &si.Created, &seconds, &si.Deadline, &si.Alive)
	si.Interval = time.Duration(seconds) * time.Second
	return si, err
}
