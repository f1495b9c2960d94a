package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shepherd-fleet/shepherd/agentproto"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// heartbeatResult is the heartbeat endpoint's ingestion rate: simulated
// agents (-heartbeat_agents identities, each a machine with an agent key
// in machine_agent_started) POST signed heartbeats over loopback HTTP, on
// -heartbeat_clients keep-alive connections, to the real heartbeat server
// (heartbeat.Server.Serve, in this process) for -heartbeat_seconds. The
// ceiling it is compared with is the bare ed25519 verification rate of
// this machine on all its cores, measured in the same run just before.
type heartbeatResult struct {
	Scenario    string  `json:"scenario"`
	Skipped     string  `json:"skipped,omitempty"` // why heartbeat_pinned did not run
	Agents      int     `json:"agents"`
	Clients     int     `json:"clients"`
	GOMAXPROCS  int     `json:"gomaxprocs"`
	Seconds     float64 `json:"seconds"`
	SeedSeconds float64 `json:"seed_seconds"`
	SignSeconds float64 `json:"sign_seconds"`
	// Sent counts requests answered; Accepted those answered 204.
	Sent     int64            `json:"sent"`
	Accepted int64            `json:"accepted"`
	Refused  map[string]int64 `json:"refused,omitempty"`
	// AgentsHeartbeated counts the agents with at least one accepted
	// heartbeat (as the sender saw it).
	AgentsHeartbeated int64 `json:"agents_heartbeated"`
	// RefusedByResult is the endpoint's own count of what it refused, by
	// shepherd_heartbeats_total's result (stale, replay, bad_signature,
	// ...): why, where Refused says only the status.
	RefusedByResult map[string]int64 `json:"refused_by_result,omitempty"`
	// Exhausted: the pre-signed heartbeats ran out before the time was up.
	Exhausted    bool    `json:"exhausted,omitempty"`
	AcceptedPerS float64 `json:"accepted_per_s"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	// DB transactions of the heartbeat database over the run
	// (pg_stat_database), per second and per 100 accepted heartbeats.
	DBXactsPerS   float64 `json:"db_xacts_per_s"`
	DBXactsPer100 float64 `json:"db_xacts_per_100_heartbeats"`
	// DBRowsTimestamped counts the heartbeat rows whose signed timestamp
	// this run's heartbeats wrote (the seed gives every row the seed's
	// time): one per agent with an accepted heartbeat.
	DBRowsTimestamped int64 `json:"db_rows_timestamped"`
	// WALBytesPer is the WAL the cluster wrote over the run per accepted
	// heartbeat (pg_current_wal_lsn before and after: the whole cluster's,
	// so the server's own background writes, a checkpoint or an
	// autovacuum in the window, count too), full-page images included:
	// what a replica of the BMDB or a WAL archive receives for each
	// heartbeat.
	WALBytesPer float64 `json:"wal_bytes_per_heartbeat"`
	// VerifyPerS is the bare ed25519.Verify rate, all cores, same run:
	// the higher of the measurements before and after sending (the
	// machine is shared; the higher one is the stricter ceiling).
	VerifyPerS       float64 `json:"verify_ceiling_per_s"`
	VerifyBeforePerS float64 `json:"verify_before_per_s"`
	VerifyAfterPerS  float64 `json:"verify_after_per_s"`
	VerifyRatio      float64 `json:"accepted_vs_verify_ceiling"`
	// BatchVerifyPerS is the rate of agentproto.BatchVerifier in batches
	// of 64, all cores, measured once before sending: the endpoint
	// verifies concurrent requests in batches, so this is the ceiling of
	// its own verification method, about twice ed25519.Verify's.
	BatchVerifyPerS  float64 `json:"batch_verify_ceiling_per_s"`
	BatchVerifyRatio float64 `json:"accepted_vs_batch_verify_ceiling"`
	// CPU time per accepted heartbeat: PostgreSQL's, the endpoint's (this
	// process, which runs nothing else meanwhile) and the sender
	// process's. EndpointRatio is the same run's bare verification time
	// per heartbeat (cores / ceiling) over the endpoint's CPU time per
	// heartbeat: the share of the ceiling one replica would reach with
	// the cores to itself (the database and the agents elsewhere).
	ServerCPUUs   float64 `json:"db_server_cpu_us_per_heartbeat"`
	EndpointCPUUs float64 `json:"endpoint_cpu_us_per_heartbeat"`
	SenderCPUUs   float64 `json:"sender_cpu_us_per_heartbeat"`
	EndpointRatio float64 `json:"endpoint_cpu_vs_verify_ceiling"`
	// EndpointCPUs and OtherCPUs (heartbeat_pinned only): the CPUs the
	// endpoint ran on, with GOMAXPROCS as many, and those PostgreSQL and
	// the sender ran on. The ceilings were measured on EndpointCPUs.
	EndpointCPUs  string `json:"endpoint_cpus,omitempty"`
	OtherCPUs     string `json:"server_and_sender_cpus,omitempty"`
	LoadAverage   string `json:"load_average"`
	CPUProfile    string `json:"cpu_profile,omitempty"`
	KeyCacheState string `json:"key_cache"`
	// PreloadedKeys and PreloadSeconds: the endpoint's key cache filled
	// before sending (heartbeat.Server.Preload, -heartbeat_preload), which
	// the counters per heartbeat leave out, as a replica's start.
	PreloadedKeys  int     `json:"preloaded_keys"`
	PreloadSeconds float64 `json:"preload_seconds,omitempty"`
}

// heartbeatKeySeed derives identity i's ed25519 key: deterministic, so
// that a run can be reproduced, and cheap to derive in parallel.
func heartbeatKeySeed(i int) []byte {
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "shepherd-bench heartbeat")
	binary.BigEndian.PutUint64(seed[ed25519.SeedSize-8:], uint64(i))
	return seed
}

// parallel runs fn(lo, hi) over [0, n) in GOMAXPROCS chunks.
func parallel(n int, fn func(lo, hi int)) {
	w := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for k := range w {
		lo, hi := n*k/w, n*(k+1)/w
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

type hbIdentity struct {
	machine uuid.UUID
	key     ed25519.PrivateKey
}

// heartbeat is the heartbeat scenario with every process on every CPU.
func (b *bench) heartbeat(ctx context.Context) error { return b.ingestScenario(ctx, "heartbeat") }

// heartbeatPinned is the heartbeat scenario with the endpoint on CPUs of
// its own (cpuSplit): one replica with its cores to itself, against the
// bare verification rate of those cores.
func (b *bench) heartbeatPinned(ctx context.Context) error {
	return b.ingestScenario(ctx, "heartbeat_pinned")
}

// ingestScenario runs the heartbeat scenario named scenario: "heartbeat",
// every process on every CPU, or "heartbeat_pinned".
func (b *bench) ingestScenario(ctx context.Context, scenario string) error {
	n := b.o.heartbeatAgents
	res := heartbeatResult{Scenario: scenario, Agents: n, Clients: b.o.heartbeatClients}
	name, dsn, err := b.srv.newDatabase(ctx, "hbi", true)
	if err != nil {
		return err
	}
	defer b.srv.dropDatabase(ctx, name)
	ids, seedTime, err := b.seedHeartbeatAgents(ctx, dsn, n)
	if err != nil {
		return err
	}
	res.SeedSeconds = seconds(seedTime)
	b.logf("%s: %d machines with agent keys seeded in %.1f s", scenario, n, seedTime.Seconds())
	if scenario == "heartbeat_pinned" {
		split, err := splitCPUs()
		if err != nil {
			res.Skipped = err.Error()
			return b.out.emit(res)
		}
		if b.srv.cluster == nil {
			res.Skipped = "pinning PostgreSQL to CPUs needs the private cluster, not -dsn"
			return b.out.emit(res)
		}
		restore, err := split.pin(b.srv)
		if err != nil {
			return err
		}
		defer func() {
			if err := restore(); err != nil {
				b.logf("%s: restoring the CPU affinity: %v", scenario, err)
			}
		}()
		res.EndpointCPUs, res.OtherCPUs = cpuList(split.endpoint), cpuList(split.others)
		b.logf("%s: the endpoint on CPUs %s, PostgreSQL and the sender on CPUs %s", scenario, res.EndpointCPUs, res.OtherCPUs)
	}
	res.GOMAXPROCS = runtime.GOMAXPROCS(0)

	res.VerifyBeforePerS, err = verifyCeiling(ctx, ids, dur(min(3, b.o.heartbeatSeconds)))
	if err != nil {
		return err
	}
	b.logf("%s: bare ed25519 verification, %d goroutines: %.0f/s", scenario, res.GOMAXPROCS, res.VerifyBeforePerS)
	if res.BatchVerifyPerS, err = batchVerifyCeiling(ctx, ids, dur(min(3, b.o.heartbeatSeconds))); err != nil {
		return err
	}
	b.logf("%s: batch verification (64), %d goroutines: %.0f/s", scenario, res.GOMAXPROCS, res.BatchVerifyPerS)

	// Enough heartbeats for the run at 1.25 times the ed25519.Verify
	// ceiling: the endpoint's batches could in principle verify faster,
	// and a run whose heartbeats ran out says so (exhausted).
	total := int(1.25*res.VerifyBeforePerS*b.o.heartbeatSeconds) + b.o.heartbeatClients
	t0 := time.Now()
	bodies := signHeartbeats(ids, total, t0)
	res.SignSeconds = seconds(time.Since(t0))
	b.logf("%s: %d heartbeats signed in %.1f s", scenario, total, res.SignSeconds)
	if skew := 60 * time.Second; time.Since(t0)+dur(b.o.heartbeatSeconds)+5*time.Second > skew {
		return fmt.Errorf("signing took %s: with -heartbeat_seconds %g the last heartbeats would be outside the server's clock skew (%s)",
			time.Since(t0).Round(time.Second), b.o.heartbeatSeconds, skew)
	}
	// The endpoint's process holds what a replica holds, not the bodies
	// and the keys of a million agents: their pointers would add to the
	// work of every garbage collection the endpoint pays for. The bodies
	// go to the sender through a file; a few identities are kept for the
	// second ceiling.
	file, err := writeBodies(bodies)
	if err != nil {
		return err
	}
	defer os.Remove(file)
	bodies = nil
	ids = slices.Clone(ids[:min(len(ids), ceilingIdentities)])
	runtime.GC()

	admin, err := connect(ctx, b.srv.adminDSN)
	if err != nil {
		return err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := waitNoBackends(ctx, admin, name); err != nil {
		return err
	}
	// Read after the preload, if any: a replica's start is not a cost per
	// heartbeat.
	var before heartbeatCounters
	readBefore := func() error {
		var err error
		before, err = b.heartbeatCounters(ctx, admin, name)
		return err
	}
	run, err := b.ingest(ctx, dsn, file, &res, readBefore)
	if err != nil {
		return err
	}
	// The pool is closed: its backends reported their transactions as
	// they exited.
	if err := waitNoBackends(ctx, admin, name); err != nil {
		return err
	}
	after, err := b.heartbeatCounters(ctx, admin, name)
	if err != nil {
		return err
	}
	if res.DBRowsTimestamped, err = countTimestamped(ctx, dsn); err != nil {
		return err
	}
	if res.VerifyAfterPerS, err = verifyCeiling(ctx, ids, dur(min(3, b.o.heartbeatSeconds))); err != nil {
		return err
	}
	res.VerifyPerS = max(res.VerifyBeforePerS, res.VerifyAfterPerS)

	res.KeyCacheState = "cold: every heartbeat was its agent's first, whose key is read from the BMDB"
	if res.PreloadedKeys > 0 {
		res.KeyCacheState = fmt.Sprintf("preloaded: every heartbeat was its agent's first since the endpoint started, which read %d keys before sending", res.PreloadedKeys)
	}
	if res.Sent > int64(n) {
		res.KeyCacheState = fmt.Sprintf("%d heartbeats of %d agents, some an agent's second", res.Sent, n)
	}
	res.Seconds = seconds(run)
	res.AcceptedPerS = round(float64(res.Accepted)/run.Seconds(), 0)
	res.DBXactsPerS = round(float64(after.xacts-before.xacts)/run.Seconds(), 1)
	if res.Accepted > 0 {
		res.DBXactsPer100 = round(100*float64(after.xacts-before.xacts)/float64(res.Accepted), 3)
		res.ServerCPUUs = round((after.serverCPU-before.serverCPU)*1e6/float64(res.Accepted), 2)
		res.WALBytesPer = round(float64(after.wal-before.wal)/float64(res.Accepted), 0)
		res.EndpointCPUUs = round((after.selfCPU-before.selfCPU)*1e6/float64(res.Accepted), 2)
		res.SenderCPUUs = round(res.SenderCPUUs*1e6/float64(res.Accepted), 2)
		if res.VerifyPerS > 0 && res.EndpointCPUUs > 0 {
			res.EndpointRatio = round(float64(res.GOMAXPROCS)*1e6/res.VerifyPerS/res.EndpointCPUUs, 3)
		}
	}
	if res.VerifyPerS > 0 {
		res.VerifyRatio = round(res.AcceptedPerS/res.VerifyPerS, 3)
	}
	if res.BatchVerifyPerS > 0 {
		res.BatchVerifyRatio = round(res.AcceptedPerS/res.BatchVerifyPerS, 3)
	}
	res.LoadAverage = loadAverage()
	b.hb = append(b.hb, res)
	b.logf("%s: %.0f accepted/s (%.1f %% of the verification ceiling, %.1f %% of the batch verification ceiling), p99 %.1f ms, %.2f DB transactions per 100 heartbeats",
		scenario, res.AcceptedPerS, 100*res.VerifyRatio, 100*res.BatchVerifyRatio, res.P99Ms, res.DBXactsPer100)
	return b.out.emit(res)
}

// seedHeartbeatAgents seeds n provided machines (set-based, qSeedMachines),
// gives each an agent key derived from its index (COPY), and the heartbeat
// row its agent's last heartbeat wrote, as in a running fleet. It returns the
// identities in a shuffled order, the order their heartbeats are sent in.
func (b *bench) seedHeartbeatAgents(ctx context.Context, dsn string, n int) ([]hbIdentity, time.Duration, error) {
	t0 := time.Now()
	conn, err := connect(ctx, dsn)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, qSeedMachines, n); err != nil {
		return nil, 0, fmt.Errorf("seeding %d machines: %w", n, err)
	}
	rows, err := conn.Query(ctx, `SELECT machine_id FROM machines ORDER BY machine_id`)
	if err != nil {
		return nil, 0, err
	}
	machines, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, 0, err
	}
	ids := make([]hbIdentity, len(machines))
	parallel(len(ids), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			ids[i] = hbIdentity{machine: machines[i], key: ed25519.NewKeyFromSeed(heartbeatKeySeed(i))}
		}
	})
	started := time.Now()
	copied, err := conn.CopyFrom(ctx, pgx.Identifier{"machine_agent_started"},
		[]string{"machine_id", "agent_started_at", "agent_public_key"},
		pgx.CopyFromSlice(len(ids), func(i int) ([]any, error) {
			return []any{ids[i].machine, started, []byte(ids[i].key.Public().(ed25519.PublicKey))}, nil
		}))
	if err != nil {
		return nil, 0, fmt.Errorf("copying agent keys: %w", err)
	}
	if copied != int64(n) {
		return nil, 0, fmt.Errorf("copied %d agent keys, want %d", copied, n)
	}
	if _, err := conn.Exec(ctx, qSeedHeartbeatRows); err != nil {
		return nil, 0, fmt.Errorf("seeding heartbeat rows: %w", err)
	}
	if err := vacuum(ctx, conn); err != nil {
		return nil, 0, err
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return ids, time.Since(t0), nil
}

// ceilingIdentities is how many identities' heartbeats the ceilings verify.
const ceilingIdentities = 4096

// verifyCeiling is the bare ed25519.Verify rate of all cores for d, over
// heartbeats of the first identities: the reference for ingestion.
func verifyCeiling(ctx context.Context, ids []hbIdentity, d time.Duration) (float64, error) {
	type msg struct {
		pub      ed25519.PublicKey
		msg, sig []byte
	}
	msgs := make([]msg, min(len(ids), ceilingIdentities))
	ts := time.Now()
	for i := range msgs {
		hb := agentproto.Heartbeat{MachineID: ids[i].machine, Timestamp: ts}
		if err := hb.Sign(ids[i].key); err != nil {
			return 0, err
		}
		msgs[i] = msg{ids[i].key.Public().(ed25519.PublicKey), hb.SignedBytes(), hb.Signature}
	}
	var count atomic.Int64
	var failed atomic.Bool
	deadline := time.Now().Add(d)
	t0 := time.Now()
	parallel(runtime.GOMAXPROCS(0), func(lo, hi int) {
		var c int64
		for i := lo; time.Now().Before(deadline) && ctx.Err() == nil; {
			for range 64 {
				m := &msgs[i%len(msgs)]
				if !ed25519.Verify(m.pub, m.msg, m.sig) {
					failed.Store(true)
				}
				i++
				c++
			}
		}
		count.Add(c)
	})
	elapsed := time.Since(t0)
	if failed.Load() {
		return 0, errors.New("verification ceiling: a signature did not verify")
	}
	return round(float64(count.Load())/elapsed.Seconds(), 0), ctx.Err()
}

// batchVerifyCeiling is the rate of agentproto.BatchVerifier, in batches
// of 64 heartbeats of the first identities, on all cores for d.
func batchVerifyCeiling(ctx context.Context, ids []hbIdentity, d time.Duration) (float64, error) {
	const batch = 64
	hbs := make([]agentproto.Heartbeat, min(len(ids), ceilingIdentities)/batch*batch)
	pubs := make([]ed25519.PublicKey, len(hbs))
	ts := time.Now()
	for i := range hbs {
		hbs[i] = agentproto.Heartbeat{MachineID: ids[i].machine, Timestamp: ts}
		if err := hbs[i].Sign(ids[i].key); err != nil {
			return 0, err
		}
		pubs[i] = ids[i].key.Public().(ed25519.PublicKey)
	}
	if len(hbs) == 0 {
		return 0, nil
	}
	var count atomic.Int64
	var failed atomic.Bool
	deadline := time.Now().Add(d)
	t0 := time.Now()
	parallel(runtime.GOMAXPROCS(0), func(lo, hi int) {
		v := agentproto.NewBatchVerifier()
		valid := make([]bool, batch)
		var c int64
		for i := lo * batch % len(hbs); time.Now().Before(deadline) && ctx.Err() == nil; i = (i + batch) % len(hbs) {
			v.Verify(hbs[i:i+batch], pubs[i:i+batch], valid)
			if slices.Contains(valid, false) {
				failed.Store(true)
			}
			c += batch
		}
		count.Add(c)
	})
	elapsed := time.Since(t0)
	if failed.Load() {
		return 0, errors.New("batch verification ceiling: a signature did not verify")
	}
	return round(float64(count.Load())/elapsed.Seconds(), 0), ctx.Err()
}

// signHeartbeats returns total heartbeat bodies: identity i%len(ids) in
// round i/len(ids), timestamps increasing in sending order from base, a
// microsecond apart (so every identity's are increasing at the BMDB's
// microsecond precision: the endpoint compares a heartbeat with the last
// one recorded, and refuses one not newer as a replay), signed on all
// cores.
func signHeartbeats(ids []hbIdentity, total int, base time.Time) [][]byte {
	bodies := make([][]byte, total)
	baseNs := base.UnixNano()
	parallel(total, func(lo, hi int) {
		var arena []byte
		for i := lo; i < hi; i++ {
			id := ids[i%len(ids)]
			hb := agentproto.Heartbeat{MachineID: id.machine, Timestamp: time.Unix(0, baseNs+int64(i)*int64(time.Microsecond)).UTC()}
			binary.BigEndian.PutUint64(hb.Nonce[:], uint64(i))
			if err := hb.Sign(id.key); err != nil {
				panic(err) // keys and timestamps are valid by construction
			}
			body, err := agentproto.EncodeHeartbeat(hb)
			if err != nil {
				panic(err)
			}
			if cap(arena)-len(arena) < len(body) {
				arena = make([]byte, 0, 1<<20)
			}
			start := len(arena)
			arena = append(arena, body...)
			bodies[i] = arena[start:len(arena):len(arena)]
		}
	})
	return bodies
}

// ingest serves the endpoint on loopback and sends the bodies of file
// (writeBodies) from -heartbeat_clients connections until
// -heartbeat_seconds have passed or the bodies ran out; with
// -heartbeat_preload, it preloads the endpoint's key cache first. It calls
// started just before sending, and closes the BMDB pool before it
// returns.
func (b *bench) ingest(ctx context.Context, dsn, file string, res *heartbeatResult, started func() error) (time.Duration, error) {
	db, err := bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: int32(b.o.maxConns)})
	if err != nil {
		return 0, err
	}
	dbClosed := false
	defer func() {
		if !dbClosed {
			db.Close()
		}
	}()
	reg := prometheus.NewRegistry()
	// Every sender connects from 127.0.0.1, standing for agents on as many
	// machines: the connection caps, which bound what one address (or a
	// flood) may hold, are raised to the senders' count so that the
	// benchmark measures heartbeats, not reconnections; and each sender's
	// connection is a source of its own for the key-lookup buckets (its
	// address and port), as each machine's address is in a fleet. Keyed
	// by address alone, the cold key cache's lookups of all the agents
	// behind one address would be bounded by one source's burst and
	// refused, which is that bucket's job, not the endpoint's capacity.
	conns := b.o.heartbeatClients + 64
	srv := heartbeat.New(db, heartbeat.Options{
		Metrics:           heartbeat.NewMetrics(reg),
		MaxConns:          conns,
		MaxConnsPerSource: conns,
		SourceKey:         func(r *http.Request) string { return r.RemoteAddr },
	})
	defer func() { res.RefusedByResult = refusedByResult(reg) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srvCtx, stopSrv := context.WithCancel(ctx)
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(srvCtx, ln, "", "") }()
	srvStopped := false
	stop := func() error {
		srvStopped = true
		stopSrv()
		return <-srvDone
	}
	defer func() {
		if !srvStopped {
			stop()
		}
	}()
	addr := ln.Addr().String()

	if b.o.heartbeatPreload {
		t0 := time.Now()
		if res.PreloadedKeys, err = srv.Preload(ctx); err != nil {
			return 0, err
		}
		res.PreloadSeconds = seconds(time.Since(t0))
		b.logf("%s: %d agent keys preloaded in %.1f s", res.Scenario, res.PreloadedKeys, res.PreloadSeconds)
	}
	if err := started(); err != nil {
		return 0, err
	}
	if b.o.heartbeatProfile != "" {
		f, err := os.Create(b.o.heartbeatProfile)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 0, err
		}
		defer pprof.StopCPUProfile()
		res.CPUProfile = b.o.heartbeatProfile
	}

	args := []string{"-heartbeat_sender", addr, "-heartbeat_bodies", file,
		"-heartbeat_clients", strconv.Itoa(b.o.heartbeatClients),
		"-heartbeat_agents", strconv.Itoa(b.o.heartbeatAgents),
		"-heartbeat_seconds", strconv.FormatFloat(b.o.heartbeatSeconds, 'f', -1, 64)}
	if res.OtherCPUs != "" {
		args = append(args, "-heartbeat_sender_cpus", res.OtherCPUs)
	}
	stdout, err := runChild(ctx, args...)
	if err != nil {
		return 0, fmt.Errorf("heartbeat sender: %w", err)
	}
	var sr senderResult
	if err := json.Unmarshal(bytes.TrimSpace(stdout), &sr); err != nil || sr.Seconds <= 0 {
		return 0, fmt.Errorf("heartbeat sender printed no result: %q", stdout)
	}
	if err := stop(); err != nil {
		return 0, err
	}
	db.Close()
	dbClosed = true

	res.Sent, res.Refused, res.Exhausted, res.AgentsHeartbeated = sr.Sent, sr.Refused, sr.Exhausted, sr.AgentsHeartbeated
	var refused int64
	for _, v := range sr.Refused {
		refused += v
	}
	res.Accepted = res.Sent - refused
	res.P50Ms, res.P99Ms = sr.P50Ms, sr.P99Ms
	res.SenderCPUUs = sr.CPUSeconds
	return dur(sr.Seconds), nil
}

// senderResult is what the sender process reports.
type senderResult struct {
	Seconds   float64          `json:"seconds"`
	Sent      int64            `json:"sent"`
	Refused   map[string]int64 `json:"refused"`
	Exhausted bool             `json:"exhausted"`
	// AgentsHeartbeated counts the identities with at least one accepted
	// heartbeat: the machines whose heartbeat row must carry one.
	AgentsHeartbeated int64   `json:"agents_heartbeated"`
	P50Ms             float64 `json:"p50_ms"`
	P99Ms             float64 `json:"p99_ms"`
	CPUSeconds        float64 `json:"cpu_seconds"` // while sending
}

// writeBodies writes bodies to a temporary file, each after its length
// (2 bytes, big-endian), for the sender process.
func writeBodies(bodies [][]byte) (string, error) {
	f, err := os.CreateTemp("", "shepherd-bench-heartbeats-")
	if err != nil {
		return "", err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	for _, body := range bodies {
		w.Write(binary.BigEndian.AppendUint16(nil, uint16(len(body))))
		w.Write(body)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// heartbeatSender is the heartbeat scenario's sender process: separate
// from the endpoint's, so that each one's CPU time is its own. It sends
// the bodies of -heartbeat_bodies to -heartbeat_sender from
// -heartbeat_clients connections for -heartbeat_seconds (or until they run
// out) and prints a senderResult.
func heartbeatSender(ctx context.Context, o *options, out emitter) error {
	if o.heartbeatSenderCPUs != "" {
		cpus, err := parseCPUList(o.heartbeatSenderCPUs)
		if err != nil {
			return err
		}
		if err := pinProcess(os.Getpid(), cpus); err != nil {
			return err
		}
		runtime.GOMAXPROCS(len(cpus))
	}
	data, err := os.ReadFile(o.heartbeatBodies)
	if err != nil {
		return err
	}
	var bodies [][]byte
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		if len(data) < 2+n {
			return errors.New("truncated bodies file")
		}
		bodies = append(bodies, data[2:2+n:2+n])
		data = data[2+n:]
	}
	type clientResult struct {
		lat       []time.Duration
		refused   map[string]int64
		exhausted bool
		err       error
	}
	results := make([]clientResult, o.heartbeatClients)
	heartbeated := make([]atomic.Uint64, (o.heartbeatAgents+63)/64)
	var wg sync.WaitGroup
	cpu0 := selfCPUSeconds()
	t0 := time.Now()
	deadline := t0.Add(dur(o.heartbeatSeconds))
	for c := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[c]
			r.refused = map[string]int64{}
			r.exhausted, r.err = sendHeartbeats(ctx, o.heartbeatSender, bodies, clientOrder(c, o.heartbeatClients, o.heartbeatAgents), deadline, r.refused, &r.lat,
				func(i int) { id := i % o.heartbeatAgents; heartbeated[id/64].Or(1 << (id % 64)) })
		}()
	}
	wg.Wait()
	sr := senderResult{Seconds: seconds(time.Since(t0)), CPUSeconds: selfCPUSeconds() - cpu0, Refused: map[string]int64{}}
	sr.Exhausted = true
	for i := range heartbeated {
		sr.AgentsHeartbeated += int64(bits.OnesCount64(heartbeated[i].Load()))
	}
	var lat []time.Duration
	for _, r := range results {
		sr.Exhausted = sr.Exhausted && r.exhausted
		if r.err != nil {
			return r.err
		}
		lat = append(lat, r.lat...)
		for k, v := range r.refused {
			sr.Refused[k] += v
		}
	}
	sr.Sent = int64(len(lat))
	sortDurations(lat)
	sr.P50Ms, sr.P99Ms = millis(percentile(lat, 0.5)), millis(percentile(lat, 0.99))
	return out.emit(sr)
}

// clientOrder returns the index of the k-th body client c of clients sends:
// the heartbeats of the identities id with id % clients == c, round after
// round (body i is identity i % agents' in round i / agents). One identity's
// heartbeats thus leave one connection in timestamp order: spread over
// clients, a stalled client would deliver one after its successor, which
// the endpoint refuses as a replay.
func clientOrder(c, clients, agents int) func(k int) int {
	per := (agents - c + clients - 1) / clients
	return func(k int) int {
		if per <= 0 {
			return math.MaxInt
		}
		return (k/per)*agents + c + (k%per)*clients
	}
}

// sendHeartbeats is one simulated sender: one keep-alive HTTP/1.1
// connection, one request at a time, the bodies in order's order. It
// writes the request in one piece and parses only what it needs of the
// response (status, Content-Length, Connection), so that the load
// generator takes little of the CPU it shares with the server. It reports
// whether it ran out of bodies.
func sendHeartbeats(ctx context.Context, addr string, bodies [][]byte, order func(k int) int, deadline time.Time, refused map[string]int64, lat *[]time.Duration, accepted func(i int)) (bool, error) {
	var conn net.Conn
	var br *bufio.Reader
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	prefix := []byte("POST " + heartbeat.Path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: ")
	buf := make([]byte, 0, 1024)
	for k := 0; ctx.Err() == nil && time.Now().Before(deadline); k++ {
		i := order(k)
		if i >= len(bodies) {
			return true, nil
		}
		if conn == nil {
			var err error
			if conn, err = net.Dial("tcp", addr); err != nil {
				return false, err
			}
			br = bufio.NewReaderSize(conn, 4096)
		}
		body := bodies[i]
		buf = append(buf[:0], prefix...)
		buf = strconv.AppendInt(buf, int64(len(body)), 10)
		buf = append(buf, "\r\n\r\n"...)
		buf = append(buf, body...)
		start := time.Now()
		if _, err := conn.Write(buf); err != nil {
			return false, fmt.Errorf("sending a heartbeat: %w", err)
		}
		status, keep, err := readResponse(br)
		if err != nil {
			return false, fmt.Errorf("reading a heartbeat response: %w", err)
		}
		*lat = append(*lat, time.Since(start))
		if status != 204 {
			refused[strconv.Itoa(status)]++
		} else {
			accepted(i)
		}
		if !keep {
			conn.Close()
			conn = nil
		}
	}
	return false, nil
}

// readResponse reads one HTTP/1.1 response and returns its status and
// whether the connection stays open.
func readResponse(br *bufio.Reader) (status int, keep bool, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, false, fmt.Errorf("malformed status line %q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("malformed status line %q", line)
	}
	keep = true
	length := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		v = bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(v)); err != nil {
				return 0, false, fmt.Errorf("malformed Content-Length %q", v)
			}
		case bytes.EqualFold(k, []byte("Connection")) && bytes.EqualFold(v, []byte("close")):
			keep = false
		}
	}
	if _, err := br.Discard(length); err != nil {
		return 0, false, err
	}
	return status, keep, nil
}

// heartbeatCounters are what the heartbeat scenario reads before and after
// sending, to divide their differences by the heartbeats accepted.
type heartbeatCounters struct {
	xacts     int64   // transactions of the heartbeat database
	wal       int64   // the cluster's WAL position, in bytes
	serverCPU float64 // PostgreSQL's CPU seconds
	selfCPU   float64 // this process's (the endpoint's) CPU seconds
}

// heartbeatCounters reads the counters of database db through admin.
func (b *bench) heartbeatCounters(ctx context.Context, admin *pgx.Conn, db string) (heartbeatCounters, error) {
	var c heartbeatCounters
	var err error
	if c.xacts, err = b.srv.xacts(ctx, admin, db); err != nil {
		return c, err
	}
	if err := admin.QueryRow(ctx, qWALPosition).Scan(&c.wal); err != nil {
		return c, fmt.Errorf("reading the WAL position: %w", err)
	}
	if c.serverCPU, err = b.srv.cpuSeconds(); err != nil {
		return c, err
	}
	c.selfCPU = selfCPUSeconds()
	return c, nil
}

// waitNoBackends waits until no backend is connected to database db: an
// exiting backend reports its statistics before it leaves pg_stat_activity.
func waitNoBackends(ctx context.Context, admin *pgx.Conn, db string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// selfCPUSeconds is this process's user and system CPU time so far.
func selfCPUSeconds() float64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(string(f[11]), 64)
	s, _ := strconv.ParseFloat(string(f[12]), 64)
	return (u + s) / 100
}

// countTimestamped counts the heartbeat rows whose signed timestamp is not
// the seed's: those the run's heartbeats wrote.
func countTimestamped(ctx context.Context, dsn string) (int64, error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	err = conn.QueryRow(ctx, qCountTimestamped).Scan(&n)
	return n, err
}

// refusedByResult reads the endpoint's shepherd_heartbeats_total from reg:
// every result but accepted, with a count.
func refusedByResult(reg *prometheus.Registry) map[string]int64 {
	byResult, err := counterBy(reg, "shepherd_heartbeats_total", "result")
	if err != nil {
		return map[string]int64{"gather_error": 1}
	}
	out := map[string]int64{}
	for result, v := range byResult {
		if result != heartbeat.ResultAccepted && v > 0 {
			out[result] = int64(v)
		}
	}
	return out
}
