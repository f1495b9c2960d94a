package faulttest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
	"github.com/shepherd-fleet/shepherd/internal/tcpproxy"
)

// TestPartitionMidTransaction partitions a replica from the database in the
// middle of ending a lease: its transaction has deleted the lease row and
// its COMMIT is lost in the partition. The server keeps that transaction,
// and its lock on the lease row, until it notices the client is gone, which
// without bmdb.Options.IdleInTransactionTimeout takes as long as TCP
// keepalives (hours). Meanwhile a healthy replica must (1) keep its own
// session, although its reaper waits on that lock, and (2) reap the
// partitioned session and release its lease once the server has ended the
// transaction, all within seconds. The fault suite meets this case by
// chance (a stall landing mid-transaction); here it is made to happen.
func TestPartitionMidTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster := sharedCluster(t)
	dsn := cluster.DSN(newDatabase(t))
	proxy, err := tcpproxy.New(net.JoinHostPort("127.0.0.1", strconv.Itoa(cluster.Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	// The default, which is longer than the sessions' interval here: the
	// healthy replica's reaper waits on the lock for seconds, longer than
	// its own session would survive without pokes.
	const idleTimeout = bmdb.DefaultIdleInTransactionTimeout
	cut := bmdbtest.OpenWith(t, withHost(t, dsn, proxy.Addr()), bmdb.Options{IdleInTransactionTimeout: idleTimeout})
	reg := prometheus.NewRegistry()
	healthy := bmdbtest.OpenWith(t, dsn, bmdb.Options{Metrics: bmdb.NewMetrics(reg), IdleInTransactionTimeout: idleTimeout})

	process := bmdb.Process{Name: "FaultTest"}
	bmdbtest.AddMachines(t, healthy, 1)
	cfg := bmdb.SessionConfig{Interval: 2 * time.Second, ReapInterval: 500 * time.Millisecond}
	partitioned, err := cut.StartSession(ctx, bmdb.SessionConfig{Component: "partitioned", Interval: cfg.Interval})
	if err != nil {
		t.Fatal(err)
	}
	bmdbtest.Register(t, cut, process, bmdb.ProvidedCandidates())
	leases, err := partitioned.Claim(ctx, bmdb.ClaimOptions{Process: process, Candidates: bmdb.ProvidedCandidates()})
	if err != nil {
		t.Fatal(err)
	}
	work := leases[0]
	cfg.Component = "healthy"
	survivor, err := healthy.StartSession(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer survivor.Close(ctx)

	// End the lease; its commit function partitions the replica, so the
	// COMMIT that follows is held by the proxy, unsent.
	finished := make(chan error, 1)
	go func() {
		finished <- work.Finish(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			proxy.Stall()
			return nil
		})
	}()

	start := time.Now()
	bmdbtest.WaitFor(t, 30*time.Second, "the partitioned session to be reaped and its lease released", func() (bool, string) {
		h, err := healthy.History(ctx, work.Machine)
		if err != nil {
			return false, err.Error()
		}
		return len(h) == 2 && h[1].Event == bmdb.EventLost, fmt.Sprintf("history %v", bmdbtest.Events(h))
	})
	took := time.Since(start)
	t.Logf("lease of the partitioned replica released %s after the partition", took.Round(time.Millisecond))
	if limit := cfg.Interval + idleTimeout + 5*time.Second; took > limit {
		t.Errorf("released after %s, want within the session interval and the idle timeout (%s, with slack)", took, limit)
	}
	if !survivor.Alive() {
		t.Error("the healthy replica lost its session while its reaper waited on the partitioned transaction")
	}
	if n := bmdbtest.MetricOrZero(t, reg, "shepherd_bmdb_sessions_expired_total"); n != 0 {
		t.Errorf("the healthy replica's sessions expired %g times", n)
	}

	// Healed: the late COMMIT finds its transaction ended by the server;
	// the replica learns that its Finish did not happen.
	proxy.Restore()
	select {
	case err := <-finished:
		if err == nil {
			t.Error("Finish succeeded although its transaction was ended by the server")
		}
		t.Logf("Finish after the partition: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("Finish did not return after the partition healed")
	}
	h, err := healthy.History(ctx, work.Machine)
	if err != nil {
		t.Fatal(err)
	}
	if got := bmdbtest.JoinEvents(bmdbtest.Events(h), ","); got != "Started,Lost" {
		t.Errorf("history %s, want Started,Lost", got)
	}
}
