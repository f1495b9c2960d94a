package heartbeat

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// defaultPreloadPage is how many agent keys Preload reads a transaction.
const defaultPreloadPage = 10000

// Preload fills the key cache with the agent keys recorded in the BMDB,
// page by page in machine order, and returns how many it cached. A replica
// that starts under a large fleet then checks its agents' first heartbeats
// against cached keys: one ordered scan of machine_agent_started instead
// of a probe per agent, and no lookup (nor a source's token) per first
// heartbeat. It caches up to MaxMachines less a thirty-second of it, room
// for agents started later, so that a fleet that fits is cached whole and
// a larger one does not fill the cache to the brim, where every new
// machine would sweep it.
//
// A machine that already has an entry (its heartbeat came first) keeps
// it. The write re-checks every key, so a key replaced after its page was
// read costs what a cached key that went stale always costs: a refusal,
// then a read once KeyRefetchInterval has passed. Preload is optional:
// without it, keys are read as heartbeats need them. ctx bounds it, each
// page also DBTimeout; an error leaves the keys cached until then.
func (s *Server) Preload(ctx context.Context) (int, error) {
	limit := s.opts.MaxMachines - s.opts.MaxMachines/32
	var after uuid.UUID
	cached := 0
	for {
		s.mu.Lock()
		room := limit - len(s.machines)
		s.mu.Unlock()
		if room <= 0 {
			return cached, nil
		}
		want := min(s.preloadPage, room)
		page, err := s.preloadPageAfter(ctx, after, want)
		if err != nil {
			return cached, err
		}
		now := time.Now()
		s.mu.Lock()
		for _, k := range page {
			if _, ok := s.machines[k.Machine]; ok || len(k.PublicKey) != ed25519.PublicKeySize {
				continue
			}
			m := machineState{hasKey: true, keyFetched: s.since(now), lastUsed: s.since(now)}
			copy(m.key[:], k.PublicKey)
			s.machines[k.Machine] = m
			cached++
		}
		s.mu.Unlock()
		if len(page) < want {
			return cached, nil
		}
		after = page[len(page)-1].Machine
	}
}

// preloadPageAfter reads up to n agent keys after machine after.
func (s *Server) preloadPageAfter(ctx context.Context, after uuid.UUID, n int) ([]bmdb.AgentKey, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.DBTimeout)
	defer cancel()
	var page []bmdb.AgentKey
	err := s.db.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		var err error
		page, err = tx.AgentKeysAfter(ctx, after, n)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("preloading agent keys: %w", err)
	}
	return page, nil
}
