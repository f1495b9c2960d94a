package faulttest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/pgcluster"
	"github.com/shepherd-fleet/shepherd/internal/replicatest"
	"github.com/shepherd-fleet/shepherd/internal/tcpproxy"
	"github.com/shepherd-fleet/shepherd/processes/agentstart"
	"github.com/shepherd-fleet/shepherd/processes/recovery"
)

// The suite's knobs. The session interval sets every deadline of the
// faults: a session expires sessionInterval after its last heartbeat and a
// live replica reaps it within reapInterval (the daemon reaps once per
// session interval).
const (
	machines        = 100
	sessionInterval = 2 * time.Second
	reapInterval    = sessionInterval
	shutdownGrace   = 2 * time.Second
	killEvery       = 3 * time.Second
	// reapSlack is what the check on orphaned leases allows on top of the
	// session deadline and the reap period: a restarted replica's start,
	// a PostgreSQL restart, the race detector's slowness. Generous on
	// purpose: it separates "reaped a little late" from "never reaped".
	reapSlack = 6 * time.Second
)

// testPassword is the DSN's password. The private cluster trusts local
// connections and ignores it, which lets the suite check that no log ever
// shows it.
const testPassword = "fault-suite-Pa55word-7c1e"

// replicaFlags make a simulated fleet busy: agent starts fail often
// (backoffs), agents die often (Recovery), timeouts and backoffs are
// seconds, sessions expire within two seconds.
func replicaFlags() []string {
	return append(replicatest.ChurnFlags(machines),
		"-agentstart_backoff_exponent=1.5",
		"-recovery_backoff_exponent=1.5",
		"-agentstart_db_query_rate=50ms,4",
		"-recovery_db_query_rate=50ms,4",
		fmt.Sprintf("-session_interval=%s", sessionInterval),
		fmt.Sprintf("-shutdown_grace=%s", shutdownGrace),
	)
}

// TestFaultSuite runs three replicas over one simulated fleet for about two
// minutes while it kills them, crashes PostgreSQL, freezes one replica and
// partitions another from the database, then proves from the database
// alone that leases never overlapped, that every lease ended exactly once,
// that no fenced replica committed under a reaped session, and that the
// replicas that went through the faults recovered without a restart.
func TestFaultSuite(t *testing.T) {
	t.Parallel()
	suiteStart := time.Now()
	ctx := context.Background()
	dir := t.TempDir()
	logDir := os.Getenv("SHEPHERD_FAULT_LOGS")
	if logDir == "" {
		logDir = filepath.Join(dir, "logs")
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}

	// The database: a private cluster, so that the suite may crash it.
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{Dir: filepath.Join(dir, "pg"), Fast: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(context.Background()); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	if err := cluster.CreateDatabase(ctx, "shepherd", ""); err != nil {
		t.Fatal(err)
	}
	dsn := withPassword(t, cluster.DSN("shepherd"), testPassword)
	if out, err := exec.Command(shepherdBinary, "migrate", "up", "-bmdb_dsn="+dsn).CombinedOutput(); err != nil {
		t.Fatalf("shepherd migrate up: %v\n%s", err, out)
	}
	db := bmdbtest.Open(t, cluster.DSN("shepherd"))
	raw, err := pgxpool.New(ctx, cluster.DSN("shepherd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)

	// r2 reaches the database through a proxy the suite controls.
	proxy, err := tcpproxy.New(net.JoinHostPort("127.0.0.1", strconv.Itoa(cluster.Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxied := withHost(t, dsn, proxy.Addr())
	// r1 reads its DSN from a file, as from a mounted secret.
	dsnFile := filepath.Join(dir, "dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r0 := replicatest.New(t, shepherdBinary, "r0", logDir, append(replicaFlags(), "-bmdb_dsn="+dsn)...)
	r1 := replicatest.New(t, shepherdBinary, "r1", logDir, append(replicaFlags(), "-bmdb_dsn_file="+dsnFile)...)
	r2 := replicatest.New(t, shepherdBinary, "r2", logDir, append(replicaFlags(), "-bmdb_dsn="+proxied)...)
	replicas := []*replicatest.Replica{r0, r1, r2}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range replicas {
				t.Logf("%s: last log lines of run %d:\n%s", r.Name, r.Current().N, r.Tail(60))
			}
			t.Logf("replica logs are in %s (set SHEPHERD_FAULT_LOGS to keep them)", logDir)
		}
	})

	groups := bmdbtest.GroupsOf(agentstart.Process, recovery.Process)

	// Warm-up: every replica ready, both processes finishing work.
	for _, r := range replicas {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	}
	waitAllReady(t, replicas, 90*time.Second)
	bmdbtest.WaitFor(t, 90*time.Second, "both processes to finish work", func() (bool, string) {
		var as, rec int
		err := raw.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE process = $1), count(*) FILTER (WHERE process = $2)
FROM work_history WHERE event = 'Finished'`, agentstart.Process.Name, recovery.Process.Name).Scan(&as, &rec)
		if err != nil {
			return false, err.Error()
		}
		return as >= 10 && rec >= 3, fmt.Sprintf("%d AgentStart and %d Recovery finished", as, rec)
	})
	t.Logf("warm-up done after %s", time.Since(suiteStart).Round(time.Millisecond))
	faultsStart := time.Now()

	// From now on, sample the leases whose session is past its deadline.
	sampler := startReapSampler(raw)
	defer sampler.stop()

	// Phase 1: kills of every replica, one PostgreSQL crash.
	chaos := startChaos(killEvery, replicas...)
	defer chaos.stop()
	soak(t, replicas, 15*time.Second, chaos)
	pgRestarts := 0
	restartPostgres(t, cluster, &pgRestarts)
	soak(t, replicas, 25*time.Second, chaos)

	// Phase 2: only r0 is killed; r1 is frozen, r2 partitioned, cut and
	// put through a second crash, and both must come back by themselves.
	chaos.setTargets(r0)
	waitAllReady(t, []*replicatest.Replica{r1, r2}, 60*time.Second)
	r1Run, r2Run := r1.Current().N, r2.Current().N
	var fences []fence

	// Freeze r1 (SIGSTOP) until the other replicas have reaped its
	// sessions, so longer than its deadline; then resume it.
	fences = append(fences, fault(t, db, raw, r1, "SIGSTOP of r1",
		func() { r1.Signal(syscall.SIGSTOP) },
		func() { r1.Signal(syscall.SIGCONT) }))
	// Partition r2 from the database (no byte moves, connections stay
	// open) until its sessions are reaped; then heal.
	fences = append(fences, fault(t, db, raw, r2, "partition of r2 (stalled connections)",
		proxy.Stall, proxy.Restore))
	restartPostgres(t, cluster, &pgRestarts)
	soak(t, replicas, 10*time.Second, chaos)
	// Cut r2's connections (reset, refused) until its sessions are reaped.
	fences = append(fences, fault(t, db, raw, r2, "cut of r2 (connections reset)",
		proxy.Cut, proxy.Restore))
	soak(t, replicas, 15*time.Second, chaos)
	chaos.stop()
	if err := chaos.error(); err != nil {
		t.Fatal(err)
	}
	faultsEnd := time.Now()

	// Every replica is ready again; r1 and r2 without a restart since
	// their faults.
	waitAllReady(t, replicas, 60*time.Second)
	if r1.Current().N != r1Run || r2.Current().N != r2Run {
		t.Errorf("r1 or r2 was restarted after its fault (runs %d→%d, %d→%d)", r1Run, r1.Current().N, r2Run, r2.Current().N)
	}
	for _, r := range []*replicatest.Replica{r1, r2} {
		expired, err := r.Metric("shepherd_bmdb_sessions_expired_total")
		if err != nil || expired < 1 {
			t.Errorf("%s: shepherd_bmdb_sessions_expired_total = %g (%v): it did not notice losing its sessions", r.Name, expired, err)
		}
	}
	sampler.stop()
	if err := sampler.check(); err != nil {
		t.Error(err)
	}

	// Shutdown: SIGTERM, exit 0 within the grace period (plus the time to
	// close sessions).
	for _, r := range replicas {
		code, took := r.Stop(shutdownGrace + 20*time.Second)
		if code != 0 {
			t.Errorf("%s exited with status %d after SIGTERM, want 0", r.Name, code)
		}
		t.Logf("%s stopped in %s", r.Name, took.Round(time.Millisecond))
	}
	// The sessions of the last killed runs expire; reaping them records
	// their leases as Lost. Then nothing is left.
	bmdbtest.WaitFor(t, 30*time.Second, "every session to be reaped and every lease released", func() (bool, string) {
		if _, _, err := db.Reap(ctx); err != nil {
			return false, err.Error()
		}
		var sessions, leases int
		if err := raw.QueryRow(ctx, `SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM work)`).Scan(&sessions, &leases); err != nil {
			return false, err.Error()
		}
		return sessions == 0 && leases == 0, fmt.Sprintf("%d sessions, %d leases left", sessions, leases)
	})

	// The audit, from the database alone.
	history := bmdbtest.History(t, db)
	// The run is over: a lease never ended is an orphan too.
	res := bmdbtest.CheckExclusion(t, history, groups)
	orphans := len(res.Orphans) + len(res.Open)
	for _, h := range res.Open {
		t.Errorf("orphan: history id %d: %s on %s (session %s) never ended", h.ID, h.Process, h.Machine, h.Session)
	}
	violations := fencingViolations(history, fences)
	for _, v := range violations {
		t.Errorf("fencing: %s", v)
	}
	taken := 0
	for _, f := range fences {
		n := len(takenOver(history, f))
		taken += n
		t.Logf("%s: %d sessions fenced, %d of their machines taken over by other replicas during the fault", f.what, len(f.sessions), n)
	}
	var machineCount, providedCount int
	if err := raw.QueryRow(ctx, `SELECT (SELECT count(*) FROM machines), (SELECT count(*) FROM machine_provided)`).Scan(&machineCount, &providedCount); err != nil {
		t.Fatal(err)
	}
	if machineCount != machines || providedCount != machines {
		t.Errorf("%d machines (%d provided) at the end, want %d", machineCount, providedCount, machines)
	}
	if res.Events[bmdb.EventFinished] == 0 || res.Events[bmdb.EventLost] == 0 {
		t.Errorf("events %v: want Finished work and Lost leases (the faults must have hit work)", res.Events)
	}

	// The logs: no panic, no data race, no password.
	logLines := 0
	for _, r := range replicas {
		for _, l := range r.LogLines() {
			logLines++
			lower := strings.ToLower(l)
			switch {
			case strings.Contains(lower, "panic"), strings.Contains(l, "DATA RACE"), strings.Contains(l, "fatal error:"):
				t.Errorf("log: %s", l)
			case strings.Contains(l, testPassword):
				t.Errorf("log shows the DSN password: %s", l)
			}
		}
	}

	runs := 0
	for _, r := range replicas {
		runs += len(r.Runs())
	}
	summary := fmt.Sprintf("FAULT-SUITE SUMMARY runs=%d kills=%d restarts=%d pg_restarts=%d freezes=1 partitions=2 "+
		"leases_checked=%d overlaps=%d orphans=%d fencing_violations=%d takeovers=%d finished=%d failed=%d canceled=%d lost=%d "+
		"max_reap_delay=%s reap_samples=%d log_lines=%d race_detector=%t under_faults=%s total=%s",
		runs, chaos.kills(), runs-len(replicas), pgRestarts,
		res.Leases, len(res.Overlaps), orphans, len(violations), taken,
		res.Events[bmdb.EventFinished], res.Events[bmdb.EventFailed], res.Events[bmdb.EventCanceled], res.Events[bmdb.EventLost],
		sampler.worst.Round(10*time.Millisecond), sampler.samples, logLines, raceBuild,
		faultsEnd.Sub(faultsStart).Round(time.Second), time.Since(suiteStart).Round(time.Second))
	t.Log(summary)
	fmt.Println(summary)
	if path := os.Getenv("SHEPHERD_FAULT_SUMMARY"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = fmt.Fprintln(f, summary)
			f.Close()
		}
		if err != nil {
			t.Errorf("writing the summary to %s: %v", path, err)
		}
	}
}

// withPassword returns the URL dsn with password set.
func withPassword(t *testing.T, dsn, password string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// withHost returns the URL dsn pointed at hostport.
func withHost(t *testing.T, dsn, hostport string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	return u.String()
}

// waitAllReady waits until every replica's /readyz answers 200.
func waitAllReady(t *testing.T, replicas []*replicatest.Replica, timeout time.Duration) {
	t.Helper()
	bmdbtest.WaitFor(t, timeout, "every replica to be ready", func() (bool, string) {
		var notReady []string
		for _, r := range replicas {
			if ok, why := r.Ready(); !ok {
				notReady = append(notReady, r.Name+": "+why)
			}
		}
		return len(notReady) == 0, strings.Join(notReady, "; ")
	})
}

// soak lets the fleet run under chaos for d, failing at once if a replica
// exits by itself (a crash) or the chaos goroutine failed. The waiting is
// the point: faults need time to land on work in progress.
func soak(t *testing.T, replicas []*replicatest.Replica, d time.Duration, c *chaos) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := c.error(); err != nil {
			t.Fatal(err)
		}
		for _, r := range replicas {
			if ru := r.Current(); ru.Exited() && !c.killed(ru) {
				t.Fatalf("%s run %d exited by itself with status %d:\n%s", r.Name, ru.N, ru.ExitCode(), r.Tail(40))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartPostgres crashes and restarts the server (pg_ctl restart -m
// immediate: no checkpoint, crash recovery at start).
func restartPostgres(t *testing.T, c *pgcluster.Cluster, n *int) {
	t.Helper()
	start := time.Now()
	if err := c.Restart(context.Background(), "immediate"); err != nil {
		t.Fatal(err)
	}
	*n++
	t.Logf("PostgreSQL restarted (immediate) in %s", time.Since(start).Round(time.Millisecond))
}

// pidRE finds the pid in a session's runtime info.
var pidRE = regexp.MustCompile(`\bpid=(\d+)\b`)

// sessionsOf lists the live sessions of the process pid.
func sessionsOf(ctx context.Context, db *bmdb.DB, pid int) ([]uuid.UUID, error) {
	all, err := db.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	var ids []uuid.UUID
	for _, s := range all {
		if m := pidRE.FindStringSubmatch(s.RuntimeInfo); m != nil && m[1] == strconv.Itoa(pid) && s.Alive {
			ids = append(ids, s.ID)
		}
	}
	return ids, nil
}

// fault applies a fault to r (begin) until the other replicas have reaped
// every session r held when it began, which they may do only once the
// session's deadline has passed, and a little longer, so that another
// replica can take over a machine r was working on; then it ends the fault
// and waits for r to be ready again, by itself. It returns the fence to
// check in history.
func fault(t *testing.T, db *bmdb.DB, raw *pgxpool.Pool, r *replicatest.Replica, what string, begin, end func()) fence {
	t.Helper()
	ctx := context.Background()
	var held []uuid.UUID
	bmdbtest.WaitFor(t, 30*time.Second, r.Name+" to hold a session per loop", func() (bool, string) {
		var err error
		held, err = sessionsOf(ctx, db, r.PID())
		if err != nil {
			return false, err.Error()
		}
		return len(held) == 2, fmt.Sprintf("%d live sessions", len(held))
	})
	began := time.Now()
	begin()
	// lastDeadline is the latest deadline of r's sessions seen in the
	// database during the fault: reaping before it would be a bug.
	var lastDeadline time.Time
	var reapedAt int64
	defer func() {
		if t.Failed() && reapedAt == 0 {
			t.Logf("database activity while %s's sessions are not reaped:\n%s", r.Name, activity(ctx, raw))
		}
	}()
	bmdbtest.WaitFor(t, 60*time.Second, "the sessions of "+r.Name+" to be reaped during the "+what, func() (bool, string) {
		all, err := db.Sessions(ctx)
		if err != nil {
			return false, err.Error()
		}
		left := 0
		for _, s := range all {
			if slices.Contains(held, s.ID) {
				left++
				if s.Deadline.After(lastDeadline) {
					lastDeadline = s.Deadline
				}
			}
		}
		if left > 0 {
			return false, fmt.Sprintf("%d of %d sessions left", left, len(held))
		}
		reapedAt, err = maxHistoryID(ctx, db)
		return err == nil, fmt.Sprint(err)
	})
	reaped := time.Now()
	if reaped.Before(lastDeadline) {
		t.Errorf("%s: sessions of %s reaped at %s, before their deadline %s", what, r.Name,
			reaped.Format(time.StampMilli), lastDeadline.Format(time.StampMilli))
	}
	// Hold the fault a little longer, until another replica takes over a
	// machine r held (if any), so that r resumes beside the new holder.
	takeoverBy := reaped.Add(2 * sessionInterval)
	for time.Now().Before(takeoverBy) {
		if n, err := takeovers(ctx, db, held); err == nil && n > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	end()
	endedAt, err := maxHistoryID(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	bmdbtest.WaitFor(t, 60*time.Second, r.Name+" to be ready again after the "+what, func() (bool, string) { return r.Ready() })
	t.Logf("%s: sessions reaped after %s, fault ended after %s, ready again after %s",
		what, reaped.Sub(began).Round(time.Millisecond), took.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	return fence{what: what, sessions: held, reapedAt: reapedAt, endedAt: endedAt}
}

// takeovers counts the machines whose leases under the fenced sessions
// were released by the reaper and then taken by another session, up to now.
func takeovers(ctx context.Context, db *bmdb.DB, fenced []uuid.UUID) (int, error) {
	h, err := db.HistoryAfter(ctx, 0, 1<<30)
	if err != nil {
		return 0, err
	}
	return len(takenOver(h, fence{sessions: fenced, endedAt: 1<<62 - 1})), nil
}

// maxHistoryID is the highest history id committed now.
func maxHistoryID(ctx context.Context, db *bmdb.DB) (int64, error) {
	var last int64
	for {
		page, err := db.HistoryAfter(ctx, last, 10000)
		if err != nil {
			return 0, err
		}
		if len(page) == 0 {
			return last, nil
		}
		last = page[len(page)-1].ID
	}
}

// periodic runs a function every interval in a goroutine of its own
// until stop: the fault suite's background actors (chaos, the reap
// sampler) run on it.
type periodic struct {
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func startPeriodic(every time.Duration, f func()) *periodic {
	p := &periodic{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			f()
		}
	}()
	return p
}

// stop stops the function's runs and returns once the last has ended.
func (p *periodic) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.done
}

// chaos kills one of its targets every period, in turn, and restarts it.
type chaos struct {
	mu      sync.Mutex // held during a kill and restart
	targets []*replicatest.Replica
	next    int
	killedR map[*replicatest.Run]bool
	err     error

	*periodic
}

func startChaos(every time.Duration, targets ...*replicatest.Replica) *chaos {
	c := &chaos{targets: targets, killedR: map[*replicatest.Run]bool{}}
	c.periodic = startPeriodic(every, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err == nil && len(c.targets) > 0 {
			r := c.targets[c.next%len(c.targets)]
			c.next++
			c.killedR[r.Current()] = true
			r.Kill()
			c.err = r.Start()
		}
	})
	return c
}

// setTargets changes who gets killed; it returns once no kill is under way.
func (c *chaos) setTargets(targets ...*replicatest.Replica) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets, c.next = targets, 0
}

func (c *chaos) error() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *chaos) killed(ru *replicatest.Run) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killedR[ru]
}

func (c *chaos) kills() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.killedR)
}

// reapSampler watches, while the faults run, for leases whose session is
// past its deadline: the reaper must release them within the reap period.
type reapSampler struct {
	samples int
	errs    int
	worst   time.Duration // longest a lease outlived its session's deadline
	worstAt time.Time

	*periodic
}

func startReapSampler(raw *pgxpool.Pool) *reapSampler {
	s := &reapSampler{}
	s.periodic = startPeriodic(250*time.Millisecond, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var overdue float64
		// While PostgreSQL restarts this fails: no sample then.
		err := raw.QueryRow(ctx, `
SELECT coalesce(extract(epoch FROM max(now() - s.session_deadline)), 0)::float8
FROM work w JOIN sessions s ON s.session_id = w.session_id
WHERE s.session_deadline < now()`).Scan(&overdue)
		if err != nil {
			s.errs++
			return
		}
		s.samples++
		if d := time.Duration(overdue * float64(time.Second)); d > s.worst {
			s.worst, s.worstAt = d, time.Now()
		}
	})
	return s
}

// check fails if a lease outlived its session's deadline by more than the
// reap period and the slack. Call after stop.
func (s *reapSampler) check() error {
	if s.samples < 100 {
		return fmt.Errorf("only %d samples of orphaned leases (%d failed): the check saw too little", s.samples, s.errs)
	}
	if limit := reapInterval + reapSlack; s.worst > limit {
		return fmt.Errorf("a lease outlived its session's deadline by %s at %s, more than the reap period %s + %s slack",
			s.worst.Round(time.Millisecond), s.worstAt.Format(time.TimeOnly), reapInterval, reapSlack)
	}
	return nil
}

// activity describes what the database's backends are doing and waiting
// for, to explain a session that is not reaped.
func activity(ctx context.Context, raw *pgxpool.Pool) string {
	rows, err := raw.Query(ctx, `
SELECT a.pid, a.state, coalesce(a.wait_event_type || ':' || a.wait_event, ''),
       coalesce(extract(epoch FROM now() - a.xact_start), 0)::float8,
       coalesce(pg_blocking_pids(a.pid)::text, ''), left(a.query, 200)
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
ORDER BY a.xact_start NULLS LAST`)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for rows.Next() {
		var pid int32
		var state, wait, blockers, query *string
		var xactAge float64
		if err := rows.Scan(&pid, &state, &wait, &xactAge, &blockers, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "pid %d %s wait=%s xact=%.1fs blocked_by=%s: %s\n", pid, deref(state), deref(wait), xactAge, deref(blockers),
			strings.Join(strings.Fields(deref(query)), " "))
	}
	return b.String()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
