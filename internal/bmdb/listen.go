package bmdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/internal/jitter"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
)

// dueChannel is the NOTIFY channel of migration 0011's triggers; the
// payload is the name of the process whose machines became due.
const dueChannel = "shepherd_due"

// cancelChannel carries operators' cancel requests (RequestCancel); the
// payload is the process whose lease is to be cancelled.
const cancelChannel = "shepherd_cancel"

// DueListener wakes a process's claimer when one of its machines becomes
// due (a watched write, the end of a lease in its exclusion group, a
// backoff ended by an operator), so that an idle claimer sleeps until then
// instead of polling. Through a transaction pooler, which cannot hold a
// LISTEN, or while its connection is down, it reports that it is not
// listening and the claimer polls.
type DueListener struct {
	wake      chan struct{}
	listening chan bool
	cancels   chan struct{}
}

// Wake receives when the process may have due work.
func (l *DueListener) Wake() <-chan struct{} { return l.wake }

// Cancels receives when an operator asked to cancel a lease of the
// process (of some replica): the runner then checks its session's
// requests (Session.CheckCancels). The same connection carries both
// notifications; without it, the session's heartbeat finds the requests.
func (l *DueListener) Cancels() <-chan struct{} { return l.cancels }

// Listening receives whenever the listener starts or stops listening; the
// first value says whether LISTEN works at all.
func (l *DueListener) Listening() <-chan bool { return l.listening }

// NewDueListener returns a listener that ListenDue feeds.
func NewDueListener() *DueListener {
	return &DueListener{wake: make(chan struct{}, 1), listening: make(chan bool, 1), cancels: make(chan struct{}, 1)}
}

// ListenDue listens for process's due notifications on a connection of its
// own and feeds l, until ctx is done. A lost connection is reconnected with
// a jittered backoff of up to 30 s.
func (db *DB) ListenDue(ctx context.Context, process Process, l *DueListener) {
	db.listenDue(ctx, process.Name, l)
}

func (db *DB) listenDue(ctx context.Context, process string, l *DueListener) {
	setListening := func(v bool) {
		select {
		case l.listening <- v:
		default: // the claimer reads the latest state on its next wait
			select {
			case <-l.listening:
			default:
			}
			l.listening <- v
		}
	}
	pooled, err := db.TransactionPooled(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil && pooled {
		klog.FromContext(ctx).Info("LISTEN is not available through a transaction pooler; polling for due work", "process", process)
		setListening(false)
		return
	}
	var pause time.Duration
	for ctx.Err() == nil {
		err := db.listenOnce(ctx, process, l, func() { pause = 0; setListening(true) })
		if ctx.Err() != nil {
			return
		}
		setListening(false)
		pause = min(max(2*pause, time.Second), 30*time.Second)
		wait := jitter.Half(pause)
		klog.FromContext(ctx).Info("Due notifications lost; polling until they are back", "process", process, "err", err, "retry_in", wait.Round(time.Millisecond))
		if !sleep.For(ctx, wait) {
			return
		}
	}
}

// listenOnce holds one LISTEN connection until it fails or ctx is done.
func (db *DB) listenOnce(ctx context.Context, process string, l *DueListener, listening func()) error {
	cfg := db.pool.Config().ConnConfig.Copy()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+dueChannel); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+cancelChannel); err != nil {
		return err
	}
	listening()
	// Something may have become due while the connection was down.
	l.signal()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload != process {
			continue
		}
		if n.Channel == cancelChannel {
			select {
			case l.cancels <- struct{}{}:
			default:
			}
			continue
		}
		l.signal()
	}
}

func (l *DueListener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}
