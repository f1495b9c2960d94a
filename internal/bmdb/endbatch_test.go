package bmdb_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// endsPerTransaction reads the histogram of lease ends per transaction:
// how many transactions carried ends, and how many ends they carried.
func endsPerTransaction(t *testing.T, reg *prometheus.Registry) (transactions uint64, ends float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "shepherd_bmdb_lease_ends_per_transaction" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatal("no shepherd_bmdb_lease_ends_per_transaction")
	return 0, 0
}

// batchBehindHeldEnd claims n+1 machines, starts a Finish of the first whose
// commit function blocks until release is closed, and returns once ends
// (started by the caller with the other n works) queue behind it.
type heldEnd struct {
	works      []*bmdb.Lease
	release    chan struct{}
	releaseNow func()
	done       chan error
}

func holdFirstEnd(t *testing.T, e *env, s *bmdb.Session, n int) *heldEnd {
	t.Helper()
	e.addMachines(n + 1)
	register(t, s, agentStart, bmdb.ProvidedCandidates())
	works, err := s.Claim(t.Context(), bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: n + 1})
	if err != nil || len(works) != n+1 {
		t.Fatalf("Claim: %d leases, %v", len(works), err)
	}
	h := &heldEnd{works: works, release: make(chan struct{}), done: make(chan error, 1)}
	var releaseOnce sync.Once
	h.releaseNow = func() { releaseOnce.Do(func() { close(h.release) }) }
	// A test that fails before releasing must not leave the end (and the
	// session's close) blocked.
	t.Cleanup(h.releaseNow)
	entered := make(chan struct{})
	go func() {
		h.done <- works[0].Finish(context.Background(), func(ctx context.Context, tx *bmdb.Tx) error {
			close(entered)
			<-h.release
			return nil
		})
	}()
	<-entered
	return h
}

// The ends of one session's concurrent workers share a transaction: while
// one end's transaction is open, the ends that arrive wait and then commit
// together, each recorded as its own Finished (with or without a commit
// function), Failed, Rescheduled or Canceled.
func TestConcurrentEndsShareATransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	e := newEnv(t, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	s := e.session(bmdb.SessionConfig{})
	const n = 10
	h := holdFirstEnd(t, e, s, n)
	// A backoff from an earlier failure, which a successful end deletes
	// and a Cancel keeps.
	for _, w := range h.works[1:] {
		e.exec(`INSERT INTO work_backoff (machine_id, process, until, cause, last_interval_seconds)
		        VALUES ($1, $2, now() - interval '1 minute', 'earlier', 60)`, w.Machine, agentStart.Name)
	}

	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, w := range h.works[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 5 {
			case 0:
				errs[i] = w.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
					return tx.SetAgentStarted(ctx, w.Machine, []byte("key"))
				})
			case 1:
				errs[i] = w.Fail(ctx, bmdb.Backoff{Initial: time.Minute}, "batched failure")
			case 2:
				errs[i] = w.Finish(ctx, nil)
			case 3:
				errs[i] = w.Reschedule(ctx, nil, time.Hour)
			case 4:
				errs[i] = w.Cancel(ctx)
			}
		}()
	}
	bmdbtest.WaitForNoError(t, 10*time.Second, "the ends to queue behind the open one", func() (bool, error) {
		return bmdb.PendingEnds(s) == n, nil
	})
	h.releaseNow()
	if err := <-h.done; err != nil {
		t.Fatalf("the first Finish: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("end %d: %v", i, err)
		}
	}
	if txs, ends := endsPerTransaction(t, reg); txs != 2 || ends != n+1 {
		t.Errorf("lease ends per transaction: %d transactions carried %v ends, want 2 carrying %d (1, then %d together)", txs, ends, n+1, n)
	}
	for i, w := range h.works[1:] {
		event := []bmdb.Event{bmdb.EventFinished, bmdb.EventFailed, bmdb.EventFinished, bmdb.EventRescheduled, bmdb.EventCanceled}[i%5]
		want := []bmdb.Event{bmdb.EventStarted, event}
		if got := bmdbtest.Events(e.history(w.Machine)); !slices.Equal(got, want) {
			t.Errorf("history of %s: %v, want %v", w.Machine, got, want)
		}
		b := e.backoffOf(w.Machine, agentStart)
		switch event {
		case bmdb.EventFailed:
			if b == nil || b.Cause != "batched failure" {
				t.Errorf("machine %s: backoff after a batched Fail: %+v", w.Machine, b)
			}
		case bmdb.EventCanceled:
			if b == nil || b.Cause != "earlier" {
				t.Errorf("machine %s: a batched Cancel did not keep the backoff: %+v", w.Machine, b)
			}
		default:
			if b != nil {
				t.Errorf("machine %s: a batched %s kept the backoff: %+v", w.Machine, event, b)
			}
		}
		var deferred bool
		if err := e.raw.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM work_not_before
		        WHERE machine_id = $1 AND process = $2 AND until > now() + interval '59 minutes')`,
			w.Machine, agentStart.Name).Scan(&deferred); err != nil {
			t.Fatal(err)
		}
		if deferred != (event == bmdb.EventRescheduled) {
			t.Errorf("machine %s: after a batched %s, deferred by an hour: %v", w.Machine, event, deferred)
		}
		if i%5 == 0 && !e.agentStarted(w.Machine) {
			t.Errorf("machine %s: the batched Finish's tag is missing", w.Machine)
		}
	}
	if n := e.leaseCount(agentStart); n != 0 {
		t.Errorf("leases after every end: %d, want 0", n)
	}
}

// In a shared transaction every end keeps its own fence and its own
// outcome: a commit function that fails, or a lease lost behind the
// worker's back (with or without a commit function), fails that end alone (its writes rolled back), while the
// others commit; a queued end whose caller gives up leaves the batch and
// its lease stays held.
func TestSharedTransactionIsolatesEachEnd(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := newEnv(t, bmdb.Options{})
	s := e.session(bmdb.SessionConfig{})
	h := holdFirstEnd(t, e, s, 5)
	failing, lost, fine, impatient, lostPlain := h.works[1], h.works[2], h.works[3], h.works[4], h.works[5]
	for _, w := range []*bmdb.Lease{lost, lostPlain} {
		if _, err := e.raw.Exec(ctx, `DELETE FROM work WHERE machine_id = $1`, w.Machine); err != nil {
			t.Fatal(err)
		}
	}

	boom := errors.New("boom")
	results := make(chan error, 4)
	go func() { results <- w(lostPlain.Cancel(ctx), "lostPlain") }()
	go func() {
		results <- w(failing.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			if err := tx.SetAgentStarted(ctx, failing.Machine, []byte("key")); err != nil {
				return err
			}
			return boom
		}), "failing")
	}()
	go func() {
		results <- w(lost.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.SetAgentStarted(ctx, lost.Machine, []byte("key"))
		}), "lost")
	}()
	go func() {
		results <- w(fine.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			return tx.SetAgentStarted(ctx, fine.Machine, []byte("key"))
		}), "fine")
	}()
	impatientCtx, giveUp := context.WithCancel(ctx)
	impatientDone := make(chan error, 1)
	go func() { impatientDone <- impatient.Cancel(impatientCtx) }()
	bmdbtest.WaitForNoError(t, 10*time.Second, "five ends to queue", func() (bool, error) {
		return bmdb.PendingEnds(s) == 5, nil
	})
	giveUp()
	if err := <-impatientDone; !errors.Is(err, context.Canceled) {
		t.Errorf("Cancel whose caller gave up while queued: %v, want context.Canceled", err)
	}
	h.releaseNow()
	if err := <-h.done; err != nil {
		t.Fatalf("the first Finish: %v", err)
	}
	got := map[string]error{}
	for range 4 {
		err := <-results
		var ne namedErr
		errors.As(err, &ne)
		got[ne.name] = ne.err
	}
	if !errors.Is(got["failing"], boom) {
		t.Errorf("Finish whose commit function failed: %v, want boom", got["failing"])
	}
	if !errors.Is(got["lost"], bmdb.ErrLeaseLost) {
		t.Errorf("Finish of a lost lease: %v, want ErrLeaseLost", got["lost"])
	}
	if !errors.Is(got["lostPlain"], bmdb.ErrLeaseLost) {
		t.Errorf("Cancel of a lost lease: %v, want ErrLeaseLost", got["lostPlain"])
	}
	if got["fine"] != nil {
		t.Errorf("Finish beside them: %v, want success", got["fine"])
	}
	if e.agentStarted(failing.Machine) || e.agentStarted(lost.Machine) {
		t.Errorf("a failed end's tag was committed")
	}
	if !e.agentStarted(fine.Machine) {
		t.Errorf("the successful end's tag is missing")
	}
	for w, want := range map[*bmdb.Lease][]bmdb.Event{
		failing:   {bmdb.EventStarted},
		lost:      {bmdb.EventStarted},
		fine:      {bmdb.EventStarted, bmdb.EventFinished},
		impatient: {bmdb.EventStarted},
		lostPlain: {bmdb.EventStarted},
	} {
		if got := bmdbtest.Events(e.history(w.Machine)); !slices.Equal(got, want) {
			t.Errorf("history of %s: %v, want %v", w.Machine, got, want)
		}
	}
	// The failed end and the withdrawn one still hold their leases and
	// can end them.
	if err := failing.Cancel(ctx); err != nil {
		t.Errorf("Cancel after a failed Finish: %v", err)
	}
	if err := impatient.Cancel(ctx); err != nil {
		t.Errorf("Cancel after a withdrawn Cancel: %v", err)
	}
	if n := e.leaseCount(agentStart); n != 0 {
		t.Errorf("leases at the end: %d, want 0", n)
	}
}

type namedErr struct {
	name string
	err  error
}

func (e namedErr) Error() string { return e.name + ": " + errors.Join(e.err).Error() }

// w tags an end's error with the end's name (nil errors too).
func w(err error, name string) error { return namedErr{name: name, err: err} }

// Asynchronous ends (FinishAsync, RescheduleAsync) queue and share a
// transaction as waiting ones do, whether the end handed the lead after a
// batch waits (a Fail, queued first here) or not (the asynchronous ones,
// whose batch a new goroutine carries): each is told its own outcome once,
// a lost lease's and a failing commit function's alone fail, and a lease
// ended asynchronously cannot be ended again. An asynchronous end that
// finds nothing in flight runs at once, alone.
func TestAsyncEndsShareATransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	e := newEnv(t, bmdb.Options{Metrics: bmdb.NewMetrics(reg)})
	s := e.session(bmdb.SessionConfig{})
	h := holdFirstEnd(t, e, s, 6)
	failed, finished, tagged, rescheduled, lost, failing := h.works[1], h.works[2], h.works[3], h.works[4], h.works[5], h.works[6]
	if _, err := e.raw.Exec(ctx, `DELETE FROM work WHERE machine_id = $1`, lost.Machine); err != nil {
		t.Fatal(err)
	}

	failDone := make(chan error, 1)
	go func() { failDone <- failed.Fail(ctx, bmdb.Backoff{Initial: time.Minute}, "queued first") }()
	bmdbtest.WaitForNoError(t, 10*time.Second, "the Fail to queue", func() (bool, error) {
		return bmdb.PendingEnds(s) == 1, nil
	})
	boom := errors.New("boom")
	results := make(chan error, 8)
	tell := func(name string) func(error) { return func(err error) { results <- w(err, name) } }
	finished.FinishAsync(ctx, time.Minute, nil, tell("finished"))
	tagged.FinishAsync(ctx, time.Minute, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.SetAgentStarted(ctx, tagged.Machine, []byte("key"))
	}, tell("tagged"))
	rescheduled.RescheduleAsync(ctx, time.Minute, nil, time.Hour, tell("rescheduled"))
	lost.FinishAsync(ctx, time.Minute, nil, tell("lost"))
	failing.FinishAsync(ctx, time.Minute, func(ctx context.Context, tx *bmdb.Tx) error {
		if err := tx.SetAgentStarted(ctx, failing.Machine, []byte("key")); err != nil {
			return err
		}
		return boom
	}, tell("failing"))
	if n := bmdb.PendingEnds(s); n != 6 {
		t.Fatalf("%d ends queued, want 6", n)
	}
	h.releaseNow()
	if err := <-h.done; err != nil {
		t.Fatalf("the first Finish: %v", err)
	}
	if err := <-failDone; err != nil {
		t.Errorf("the queued Fail: %v", err)
	}
	got := map[string]error{}
	for range 5 {
		var ne namedErr
		errors.As(<-results, &ne)
		if _, dup := got[ne.name]; dup {
			t.Errorf("%s told its outcome twice", ne.name)
		}
		got[ne.name] = ne.err
	}
	for _, name := range []string{"finished", "tagged", "rescheduled"} {
		if err, ok := got[name]; !ok || err != nil {
			t.Errorf("%s: told %v (%v), want success", name, err, ok)
		}
	}
	if !errors.Is(got["lost"], bmdb.ErrLeaseLost) {
		t.Errorf("FinishAsync of a lost lease: %v, want ErrLeaseLost", got["lost"])
	}
	if !errors.Is(got["failing"], boom) {
		t.Errorf("FinishAsync whose commit function failed: %v, want boom", got["failing"])
	}
	if txs, ends := endsPerTransaction(t, reg); txs != 2 || ends != 7 {
		t.Errorf("lease ends per transaction: %d transactions carried %v ends, want 2 carrying 7 (1, then 6 together)", txs, ends)
	}
	for m, want := range map[*bmdb.Lease][]bmdb.Event{
		failed:      {bmdb.EventStarted, bmdb.EventFailed},
		finished:    {bmdb.EventStarted, bmdb.EventFinished},
		tagged:      {bmdb.EventStarted, bmdb.EventFinished},
		rescheduled: {bmdb.EventStarted, bmdb.EventRescheduled},
		failing:     {bmdb.EventStarted},
	} {
		if got := bmdbtest.Events(e.history(m.Machine)); !slices.Equal(got, want) {
			t.Errorf("history of %s: %v, want %v", m.Machine, got, want)
		}
	}
	if !e.agentStarted(tagged.Machine) || e.agentStarted(failing.Machine) {
		t.Errorf("tags: the committed end's %v (want true), the failed one's %v (want false)", e.agentStarted(tagged.Machine), e.agentStarted(failing.Machine))
	}
	again := make(chan error, 1)
	finished.FinishAsync(ctx, time.Minute, nil, func(err error) { again <- err })
	if err := <-again; !errors.Is(err, bmdb.ErrLeaseEnded) {
		t.Errorf("FinishAsync of an ended lease: %v, want ErrLeaseEnded", err)
	}

	// Alone: nothing in flight, so it is carried at once.
	if err := failing.Cancel(ctx); err != nil {
		t.Fatalf("Cancel of the lease whose Finish failed: %v", err)
	}
	e.addMachines(1)
	works, err := s.Claim(ctx, bmdb.ClaimOptions{Process: agentStart, Candidates: bmdb.ProvidedCandidates(), Max: 1})
	if err != nil || len(works) != 1 {
		t.Fatalf("Claim: %d leases, %v", len(works), err)
	}
	works[0].FinishAsync(ctx, time.Minute, nil, func(err error) { again <- err })
	if err := <-again; err != nil {
		t.Errorf("a lone FinishAsync: %v", err)
	}
	if n := e.leaseCount(agentStart); n != 0 {
		t.Errorf("leases after every end: %d, want 0", n)
	}
}
