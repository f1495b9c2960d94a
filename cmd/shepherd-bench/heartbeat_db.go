package main

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// heartbeatDBResult is the database's cost of recording heartbeats: batches
// of the heartbeat statement (qHeartbeatAgents, through
// Tx.RecordHeartbeats) over a fleet whose every machine has an agent, as
// the heartbeat endpoint writes them. Measured twice in the same run: with
// migration 0011's due trigger on machine_agent_heartbeat, and with it
// disabled (the schema before due-time claiming).
type heartbeatDBResult struct {
	Scenario        string  `json:"scenario"`
	DueTrigger      bool    `json:"due_trigger"`
	Machines        int     `json:"machines"`
	Batch           int     `json:"batch"`
	Seconds         float64 `json:"seconds"`
	Rows            int64   `json:"rows"`
	RowsPerS        float64 `json:"rows_per_s"`
	BatchP50Ms      float64 `json:"batch_p50_ms"`
	BatchP99Ms      float64 `json:"batch_p99_ms"`
	ServerCPUUsPerR float64 `json:"server_cpu_us_per_row"`
	HOTPercent      float64 `json:"hot_update_percent"`
}

const heartbeatDBBatch = 1000

// heartbeatDB writes heartbeat batches of random machines back to back
// from one connection for -seconds, each as its own transaction.
func (b *bench) heartbeatDB(ctx context.Context) error {
	n := b.o.idleMachines
	name, dsn, _, err := b.seededDatabase(ctx, "hb", n, true)
	if err != nil {
		return err
	}
	defer b.srv.dropDatabase(ctx, name)
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT machine_id FROM machines`)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return err
	}
	// Every machine has heartbeated once: the measured batches update rows,
	// as in a running fleet.
	if _, err := conn.Exec(ctx, qSeedHeartbeatRows); err != nil {
		return err
	}
	if err := vacuum(ctx, conn); err != nil {
		return err
	}
	db, err := bmdb.Open(ctx, dsn, bmdb.Options{MaxConns: 4})
	if err != nil {
		return err
	}
	defer db.Close()
	for _, trigger := range []bool{true, false} {
		action := "ENABLE"
		if !trigger {
			action = "DISABLE"
		}
		if _, err := conn.Exec(ctx, "ALTER TABLE machine_agent_heartbeat "+action+" TRIGGER shepherd_due_insert"); err != nil {
			return err
		}
		res, err := b.heartbeatRun(ctx, db, conn, ids)
		if err != nil {
			return err
		}
		res.DueTrigger = trigger
		if err := b.out.emit(res); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) heartbeatRun(ctx context.Context, db *bmdb.DB, conn *pgx.Conn, ids []uuid.UUID) (heartbeatDBResult, error) {
	size := min(heartbeatDBBatch, len(ids))
	res := heartbeatDBResult{Scenario: "heartbeat_db", Machines: len(ids), Batch: size}
	var upd0, hot0 int64
	statsQ := `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'machine_agent_heartbeat'`
	if _, err := conn.Exec(ctx, qFlushStats); err != nil {
		return res, err
	}
	if err := conn.QueryRow(ctx, statsQ).Scan(&upd0, &hot0); err != nil {
		return res, err
	}
	cpu0, err := b.srv.cpuSeconds()
	if err != nil {
		return res, err
	}
	// Each batch holds distinct machines (as the recorder's do), taken in
	// turn from a shuffled fleet, so every row is updated as often.
	rng := rand.New(rand.NewPCG(1, 2))
	order := append([]uuid.UUID(nil), ids...)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	batch := make([]bmdb.AgentKey, size)
	var lat []time.Duration
	next := 0
	t0 := time.Now()
	for time.Since(t0) < dur(b.o.seconds) {
		now := time.Now()
		for i := range batch {
			batch[i] = bmdb.AgentKey{Machine: order[next%len(order)], PublicKey: []byte{0}, Timestamp: now}
			next++
		}
		start := time.Now()
		var recorded int
		err := db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
			rec, _, err := tx.RecordHeartbeats(ctx, batch)
			recorded = len(rec)
			return err
		})
		if err != nil {
			return res, err
		}
		lat = append(lat, time.Since(start))
		res.Rows += int64(recorded)
	}
	elapsed := time.Since(t0)
	cpu1, err := b.srv.cpuSeconds()
	if err != nil {
		return res, err
	}
	// Statistics reach pg_stat_user_tables when backends report them.
	time.Sleep(idleStatsDelay)
	var upd1, hot1 int64
	if err := conn.QueryRow(ctx, statsQ).Scan(&upd1, &hot1); err != nil {
		return res, err
	}
	sortDurations(lat)
	res.Seconds = seconds(elapsed)
	res.RowsPerS = round(float64(res.Rows)/elapsed.Seconds(), 0)
	res.BatchP50Ms, res.BatchP99Ms = millis(percentile(lat, 0.5)), millis(percentile(lat, 0.99))
	if res.Rows > 0 {
		res.ServerCPUUsPerR = round((cpu1-cpu0)*1e6/float64(res.Rows), 2)
	}
	if upd1 > upd0 {
		res.HOTPercent = round(100*float64(hot1-hot0)/float64(upd1-upd0), 1)
	}
	b.logf("heartbeat_db (due trigger %v): %.0f rows/s, %.2f µs server CPU per row, %.1f %% HOT",
		res.DueTrigger, res.RowsPerS, res.ServerCPUUsPerR, res.HOTPercent)
	return res, nil
}
