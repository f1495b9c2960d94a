// Package httpinv is a provider of the example's own: its machines are the
// ones an HTTP inventory lists (a CMDB's endpoint returning JSON), added
// when they appear and removed when they disappear, and their agents are
// Shepherd's simulated agents (sim.Agents), so that AgentStart and
// Recovery run on them without touching a machine. A provider for real
// hardware would start agents over SSH and reboot through the BMC instead;
// the inventory half stays the same.
//
// The inventory is a JSON array of machines:
//
//	[{"id": "rack1-node1", "address": "10.0.1.1", "location": "rack1"}, ...]
package httpinv

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/sim"
)

// Name is the provider's -provider name and its machines' provider in the
// BMDB.
const Name = "httpinventory"

// Config is the provider's configuration, set by -httpinventory_*.
type Config struct {
	// URL is the inventory's address.
	URL string
	// Poll is how often the inventory is read again.
	Poll time.Duration
	// Agents configures the simulated agents (-httpinventory_agent_*,
	// -httpinventory_heartbeat_*, ...).
	Agents sim.AgentConfig
}

// DefaultConfig is the flags' defaults.
func DefaultConfig() Config {
	return Config{Poll: 30 * time.Second, Agents: sim.DefaultAgentConfig()}
}

// RegisterFlags registers the -httpinventory_* flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, Name+"_url", c.URL, "address of the inventory: an HTTP GET returning a JSON array of {\"id\", \"address\", \"location\"} (required)")
	fs.DurationVar(&c.Poll, Name+"_poll", c.Poll, "how often the inventory is read again")
	c.Agents.RegisterFlags(fs, Name+"_")
}

// Check validates the flags; its errors name the flag.
func (c *Config) Check() error {
	u, err := url.Parse(c.URL)
	switch {
	case c.URL == "":
		return fmt.Errorf("-%s_url: required (the inventory's address)", Name)
	case err != nil:
		return fmt.Errorf("-%s_url %q: %w", Name, c.URL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("-%s_url %q: must be an http or https address", Name, c.URL)
	case c.Poll <= 0:
		return fmt.Errorf("-%s_poll %s: must be positive", Name, c.Poll)
	}
	return c.Agents.Check(Name + "_")
}

// Machine is one entry of the inventory.
type Machine struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	Location string `json:"location"`
}

// maxInventory bounds the inventory's size, so that a broken or hostile
// endpoint cannot exhaust the daemon's memory.
const maxInventory = 16 << 20

// ErrNotListed is the error of an action on a machine the inventory no
// longer lists but that is still in the BMDB (a process held a lease on it
// when it was to be removed): the action fails, its lease ends, and the
// next sync removes the machine.
var ErrNotListed = errors.New("machine no longer listed in the inventory")

// notListedBackoff is the backoff of an action failed with ErrNotListed:
// nothing will change for the machine but its removal.
var notListedBackoff = bmdb.Backoff{Initial: time.Hour, Maximum: 24 * time.Hour, Exponent: 2}

// Provider is the HTTP inventory's provider: the inventory's machines,
// and simulated agents for them (the embedded sim.Agents, configured to
// serve this provider's machines only).
type Provider struct {
	*sim.Agents
	db     bmdb.DB
	cfg    Config
	client *http.Client

	mu sync.Mutex
	// unlisted holds the provider ids the last sync found unlisted but
	// could not remove.
	unlisted map[string]bool
}

// New returns the provider over db; cfg must have passed Check.
func New(db bmdb.DB, cfg Config) (*Provider, error) {
	ac := cfg.Agents
	ac.Providers = []string{Name}
	agents, err := sim.NewAgents(db, ac)
	if err != nil {
		return nil, err
	}
	return &Provider{
		Agents:   agents,
		db:       db,
		cfg:      cfg,
		client:   &http.Client{Timeout: min(cfg.Poll, time.Minute)},
		unlisted: map[string]bool{},
	}, nil
}

// Name implements providers.Provider.
func (*Provider) Name() string { return Name }

// StartAgent implements providers.Provider: a simulated agent start, unless
// the inventory no longer lists the machine.
func (p *Provider) StartAgent(ctx context.Context, m bmdb.Provided) ([]byte, error) {
	if err := p.listed(m); err != nil {
		return nil, err
	}
	return p.Agents.StartAgent(ctx, m)
}

// Reboot implements providers.Provider: a simulated reboot, unless the
// inventory no longer lists the machine.
func (p *Provider) Reboot(ctx context.Context, m bmdb.Provided) error {
	if err := p.listed(m); err != nil {
		return err
	}
	return p.Agents.Reboot(ctx, m)
}

// PowerOn implements providers.PowerOner, as Reboot does.
func (p *Provider) PowerOn(ctx context.Context, m bmdb.Provided) error {
	if err := p.listed(m); err != nil {
		return err
	}
	return p.Agents.PowerOn(ctx, m)
}

var (
	_ providers.Provider    = (*Provider)(nil)
	_ providers.PowerReader = (*Provider)(nil)
	_ providers.PowerOner   = (*Provider)(nil)
)

func (p *Provider) listed(m bmdb.Provided) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unlisted[m.ProviderID] {
		// Backed off, not retried at once: the next sync removes the
		// machine once its lease ended, backoff and all.
		return backoff.With(fmt.Errorf("%s: %s: %w", Name, m.ProviderID, ErrNotListed), notListedBackoff)
	}
	return nil
}

// Fetch reads the inventory at url. An inventory that is not a JSON array
// of machines with distinct, non-empty ids is an error: syncing it would
// remove machines that a broken answer merely left out.
func Fetch(ctx context.Context, client *http.Client, url string) ([]Machine, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("reading the inventory %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the inventory: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the inventory %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxInventory+1))
	if err != nil {
		return nil, fmt.Errorf("reading the inventory %s: %w", url, err)
	}
	if len(body) > maxInventory {
		return nil, fmt.Errorf("reading the inventory %s: larger than %d bytes", url, maxInventory)
	}
	var ms []Machine
	if err := json.Unmarshal(body, &ms); err != nil {
		return nil, fmt.Errorf("inventory %s: not a JSON array of machines: %w", url, err)
	}
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		switch {
		case m.ID == "":
			return nil, fmt.Errorf("inventory %s: machine %d has no id", url, i)
		case seen[m.ID]:
			return nil, fmt.Errorf("inventory %s: machine id %q listed twice", url, m.ID)
		}
		seen[m.ID] = true
	}
	return ms, nil
}

// SyncResult is what one Sync changed, by provider id. Kept are the
// machines no longer listed that are still in the BMDB: leased by a
// process (bmdb.ErrLeased), or whose removal failed. The next Sync tries
// again.
type SyncResult = providers.SyncResult

// Sync reads the inventory and makes the BMDB's machines of this provider
// match it with providers.SyncMachines: new entries become machines and
// changed ones are updated; each machine no longer listed is removed, and
// its history stays, ending with Removed.
//
// The policy is to remove: an inventory is the truth about which machines
// exist. A provider whose inventory may drop machines by mistake would
// keep them instead (SyncOptions.KeepUnlisted) and fail their actions (as
// ErrNotListed does here for a machine whose removal must wait for its
// lease to end).
func (p *Provider) Sync(ctx context.Context) (SyncResult, error) {
	listed, err := Fetch(ctx, p.client, p.cfg.URL)
	if err != nil {
		return SyncResult{}, err
	}
	want := make([]bmdb.Provided, 0, len(listed))
	for _, m := range listed {
		want = append(want, bmdb.Provided{ProviderID: m.ID, Address: m.Address, Location: m.Location})
	}
	res, err := providers.SyncMachines(ctx, p.db, Name, want, providers.SyncOptions{Source: "the inventory " + p.cfg.URL})
	if err != nil {
		return SyncResult{}, err
	}
	for _, machine := range res.Gone {
		p.Forget(machine)
	}
	kept := make(map[string]bool, len(res.Kept))
	for _, id := range res.Kept {
		kept[id] = true
	}
	p.mu.Lock()
	p.unlisted = kept
	p.mu.Unlock()
	return res, nil
}

// Prepare syncs the inventory once before the loops start
// (providers.Preparer); the daemon retries it while it fails.
func (p *Provider) Prepare(ctx context.Context) error {
	res, err := p.Sync(ctx)
	if err != nil {
		return err
	}
	p.log(ctx, res)
	return nil
}

// Run runs the simulated agents and syncs the inventory every Poll until
// ctx is done (providers.Runner). A failed sync is logged and changes
// nothing; the next one tries again.
func (p *Provider) Run(ctx context.Context) error {
	agents := make(chan error, 1)
	go func() { agents <- p.Agents.Run(ctx) }()
	tick := time.NewTicker(p.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return <-agents
		case err := <-agents:
			return err
		case <-tick.C:
		}
		res, err := p.Sync(ctx)
		if err != nil {
			if ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "Inventory sync failed; the BMDB keeps the last inventory")
			}
			continue
		}
		p.log(ctx, res)
	}
}

func (p *Provider) log(ctx context.Context, res SyncResult) {
	if len(res.Added)+len(res.Updated)+len(res.Removed)+len(res.Kept) == 0 {
		return
	}
	klog.FromContext(ctx).Info("Inventory synced", "added", res.Added, "updated", res.Updated, "removed", res.Removed, "kept", res.Kept)
}

// Definition registers the provider: d.AddProvider(httpinv.Definition()).
func Definition() providers.Definition {
	cfg := DefaultConfig()
	return providers.Definition{
		Name:  Name,
		Usage: "machines from an HTTP inventory, with simulated agents",
		// Its agents and power are simulated: demo mode (no database
		// given) may run with it.
		Demo:  true,
		Flags: cfg.RegisterFlags,
		Check: cfg.Check,
		New: func(env providers.Env) (providers.Provider, error) {
			return New(env.DB, cfg)
		},
	}
}
