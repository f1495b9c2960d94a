// Package static is the provider of a fleet listed in an inventory file:
// on-premises machines that Shepherd reaches over SSH, and reboots through
// their BMC's Redfish API or, without a BMC, over SSH.
//
// The inventory (see Inventory for its format) is synced into
// machine_provided at start and at every Reload (the daemon's SIGHUP): new
// entries become machines, changed SSH addresses and locations are updated,
// and machines the file no longer lists are removed from the BMDB
// (bmdb.Tx.RemoveMachine: their history stays, ending with Removed). A
// machine a process holds a lease on is not removed under it: it is kept
// until the lease ends (its action fails with ErrNotInInventory) and
// removed then, by Run. With -inventory_keep_unlisted they are all kept
// instead, and their actions fail until they are listed again. Kept
// machines are counted in the shepherd_inventory_removed_machines gauge. A
// file that does not parse or validate is rejected whole, with its
// problems' lines and fields, and the last good inventory stays in force:
// a broken file removes nothing.
//
// Where machine data lives: machine_provided holds what every replica and
// every operator query needs, the SSH address as host:port and the
// location. The rest of a machine's entry (SSH user, BMC endpoint,
// credentials file, system id, reset type, CA file) stays in the in-memory
// inventory, keyed by provider id: a daemon running this provider always
// has the inventory loaded, and credentials file names have no business in
// the database. Every replica must therefore run with the same inventory
// file, and reload it when it changes.
package static

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/backoff"
	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/metric"
	"github.com/shepherd-fleet/shepherd/internal/sleep"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
	"github.com/shepherd-fleet/shepherd/providers/ipmi"
	"github.com/shepherd-fleet/shepherd/providers/redfish"
	"github.com/shepherd-fleet/shepherd/providers/sshagent"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Name is the provider's name in machine_provided.provider.
const Name = "static"

// RemovedBackoff is the backoff of an action on a machine removed from the
// inventory but still in the BMDB (kept while leased, or by
// -inventory_keep_unlisted): nothing will change for it until an operator
// lists it again, or it is removed.
var RemovedBackoff = bmdb.Backoff{Initial: time.Hour, Maximum: 24 * time.Hour, Exponent: 2}

// Config is the static provider's configuration.
type Config struct {
	// InventoryFile is the inventory's path.
	InventoryFile string
	// SSH configures logins, agent start and SSH reboots.
	SSH sshagent.Config
	// Redfish configures BMC reboots through Redfish.
	Redfish redfish.Config
	// IPMI configures BMC reboots through IPMI.
	IPMI ipmi.Config
	// KeepUnlisted keeps the machines the inventory no longer lists in
	// the BMDB instead of removing them (SyncOptions.KeepUnlisted).
	KeepUnlisted bool
	// RemoveRetry is how often Run tries again to remove the unlisted
	// machines a lease kept (0: DefaultRemoveRetry).
	RemoveRetry time.Duration
	// CheckBMCs makes Run check every BMC of the inventory (CheckBMC)
	// when it is loaded or reloaded, before any machine needs one.
	CheckBMCs bool
}

// DefaultRemoveRetry is how often Run tries again to remove a machine that
// was leased when the inventory stopped listing it. The lease ends soon
// (the action fails with ErrNotInInventory); each try costs one listing of
// the provider's machines, and only while such a machine is left.
const DefaultRemoveRetry = 10 * time.Second

// DefaultConfig returns the configuration before flags.
func DefaultConfig() Config {
	return Config{SSH: sshagent.DefaultConfig(), Redfish: redfish.DefaultConfig(), IPMI: ipmi.DefaultConfig()}
}

// RegisterFlags registers -inventory and the SSH and Redfish flags on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.InventoryFile, "inventory", c.InventoryFile, "static provider: YAML or JSON file listing the machines (reloaded on SIGHUP)")
	fs.BoolVar(&c.KeepUnlisted, "inventory_keep_unlisted", c.KeepUnlisted, "static provider: keep the machines the inventory no longer lists (their actions fail until listed again) instead of removing them from the BMDB")
	fs.BoolVar(&c.CheckBMCs, "inventory_check_bmcs", c.CheckBMCs, "static provider: when the inventory loads or reloads, check every machine's BMC in the background (as shepherd bmc check, acting on none), log the problems and count them in shepherd_inventory_bmc_check_failures")
	c.SSH.RegisterFlags(fs)
	c.Redfish.RegisterFlags(fs)
	c.IPMI.RegisterFlags(fs)
}

// Check validates the configuration, including the inventory file; its
// errors name the flag (and, for the inventory, the file's line and field).
func (c *Config) Check() error {
	if c.InventoryFile == "" {
		return errors.New("-inventory: required with -provider static")
	}
	if _, err := Load(c.InventoryFile); err != nil {
		return fmt.Errorf("-inventory: %w", err)
	}
	if err := c.SSH.Check(); err != nil {
		return err
	}
	if err := c.Redfish.Check(); err != nil {
		return err
	}
	return c.IPMI.Check()
}

// Provider is the static provider. It implements providers.Provider.
type Provider struct {
	cfg     Config
	db      bmdb.DB
	ssh     *sshagent.Client
	redfish *redfish.Client
	ipmi    *ipmi.Client
	metrics *metrics

	reloadMu sync.Mutex // serializes Reload
	mu       sync.RWMutex
	inv      *Inventory
	// kept is how many unlisted machines the last sync left in the BMDB
	// because they were leased (guarded by reloadMu): Run retries while
	// it is not zero.
	kept int
	// checkBMCs asks Run to check the BMCs of the inventory in force
	// (-inventory_check_bmcs); a request made while one waits is the same.
	checkBMCs chan struct{}
}

var _ providers.Provider = (*Provider)(nil)

// New loads the inventory, syncs it into the BMDB and returns the provider.
// Its metrics are registered with reg (nil: not registered). Host keys are
// pinned in db unless cfg.SSH names a known_hosts file.
func New(ctx context.Context, cfg Config, db bmdb.DB, reg prometheus.Registerer) (*Provider, error) {
	p, err := Open(cfg, db, reg)
	if err != nil {
		return nil, err
	}
	if err := p.Sync(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Open loads the inventory and returns the provider without touching the
// BMDB: a daemon started while its database is down opens the provider
// once (its metrics are registered with reg, nil: not registered) and calls
// Sync until the database answers. The inventory is in force, but its
// machines may not be in the BMDB until Sync succeeds.
func Open(cfg Config, db bmdb.DB, reg prometheus.Registerer) (*Provider, error) {
	ssh, err := sshagent.New(cfg.SSH, sshagent.BMDBPins{DB: db})
	if err != nil {
		return nil, err
	}
	inv, err := Load(cfg.InventoryFile)
	if err != nil {
		return nil, err
	}
	p := &Provider{
		cfg:     cfg,
		db:      db,
		ssh:     ssh,
		redfish: redfish.New(cfg.Redfish),
		ipmi:    ipmi.New(cfg.IPMI),
		metrics: newMetrics(reg),
		inv:     inv,

		checkBMCs: make(chan struct{}, 1),
	}
	p.metrics.machines.Set(float64(len(inv.Machines)))
	return p, nil
}

// Sync syncs the inventory in force into the BMDB, as Reload does but
// without reading the file again. A failure (the BMDB cannot be written) is
// returned and not counted as a rejected load: the caller retries.
func (p *Provider) Sync(ctx context.Context) error {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	return p.sync(ctx, p.Inventory(), false)
}

// Name implements providers.Provider.
func (p *Provider) Name() string { return Name }

// Inventory returns the inventory in force.
func (p *Provider) Inventory() *Inventory {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.inv
}

// SSHPublicKey is the key Shepherd logs in with, in authorized_keys
// format, for operators to install on machines.
func (p *Provider) SSHPublicKey() string { return p.ssh.PublicKey() }

// Reload reads the inventory file again and syncs it into the BMDB: the
// provider's answer to SIGHUP (providers.Reloader), which it logs with its
// outcome. On any error (the file does not parse or validate, or the BMDB
// cannot be written) it returns the error and the previous inventory stays
// in force.
func (p *Provider) Reload(ctx context.Context) error {
	log := klog.FromContext(ctx)
	last := p.Inventory()
	log.Info("Received SIGHUP: reloading the inventory", "file", last.File)
	err := p.reload(ctx)
	if err != nil {
		log.Error(err, "Inventory not reloaded, the last good one stays in force", "file", last.File, "machines", len(last.Machines))
	}
	return err
}

// reload is Reload without its log lines.
func (p *Provider) reload(ctx context.Context) error {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	inv, err := Load(p.cfg.InventoryFile)
	if err != nil {
		p.metrics.reloaded(false)
		return err
	}
	return p.sync(ctx, inv, true)
}

// sync syncs inv into the BMDB and puts it in force. countFailure says
// whether a failure counts as a rejected load in the metrics.
func (p *Provider) sync(ctx context.Context, inv *Inventory, countFailure bool) error {
	// Replicas starting together may race to add the same new machine:
	// the loser's transaction fails on the unique provider id, and its
	// next attempt sees the winner's row.
	logger := klog.FromContext(ctx)
	var res SyncResult
	var err error
	for attempt := 1; ; attempt++ {
		res, err = Sync(ctx, p.db, inv, SyncOptions{KeepUnlisted: p.cfg.KeepUnlisted})
		if err == nil || attempt == 3 || ctx.Err() != nil {
			break
		}
		logger.Error(err, "Inventory sync failed, retrying", "file", inv.File, "attempt", attempt)
		sleep.For(ctx, time.Duration(attempt)*200*time.Millisecond)
	}
	if err != nil {
		if countFailure {
			p.metrics.reloaded(false)
		}
		return err
	}
	p.mu.Lock()
	p.inv = inv
	p.mu.Unlock()
	p.metrics.reloaded(true)
	p.metrics.machines.Set(float64(len(inv.Machines)))
	if p.cfg.CheckBMCs {
		select {
		case p.checkBMCs <- struct{}{}:
		default:
		}
	}
	logger.Info("Inventory synced", "file", inv.File, "machines", len(inv.Machines), "added", len(res.Added), "updated", len(res.Updated), "removed", len(res.Removed))
	if len(res.Added) > 0 {
		logger.V(1).Info("Inventory: machines added", "file", inv.File, "machines", res.Added)
	}
	if len(res.Updated) > 0 {
		logger.Info("Inventory: address or location changed", "file", inv.File, "machines", res.Updated)
	}
	p.reportRemovals(logger, inv, res)
	return nil
}

// reportRemovals logs (to logger) and counts what a sync removed and kept.
func (p *Provider) reportRemovals(logger klog.Logger, inv *Inventory, res SyncResult) {
	p.metrics.removed.Set(float64(len(res.Kept)))
	p.metrics.removals.Add(float64(len(res.Removed)))
	if !p.cfg.KeepUnlisted {
		p.kept = len(res.Kept)
	}
	if len(res.Removed) > 0 {
		logger.Info("Inventory: machines no longer listed were removed from the BMDB (their history stays: shepherd history ID)",
			"file", inv.File, "count", len(res.Removed), "machines", clipList(res.Removed, 50))
	}
	switch {
	case len(res.Kept) == 0:
	case p.cfg.KeepUnlisted:
		logger.Info("Inventory: machines in the BMDB are no longer listed and are kept (-inventory_keep_unlisted; their actions fail until they are listed again)",
			"file", inv.File, "count", len(res.Kept), "machines", clipList(res.Kept, 50))
	default:
		logger.Info("Inventory: machines no longer listed are kept while leased (or while their removal fails), and removed after; removal is tried again",
			"file", inv.File, "count", len(res.Kept), "machines", clipList(res.Kept, 50), "every", p.removeRetry())
	}
}

func (p *Provider) removeRetry() time.Duration {
	if p.cfg.RemoveRetry > 0 {
		return p.cfg.RemoveRetry
	}
	return DefaultRemoveRetry
}

// Run removes, until ctx is done, the unlisted machines that a sync kept
// because they were leased: every RemoveRetry while any is left, it syncs
// the inventory in force again. A failed try is logged and tried again.
// It returns nil when ctx is done. With -inventory_check_bmcs it also
// checks the BMCs after each load, in a goroutine of its own, so that a
// slow BMC delays no removal.
func (p *Provider) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.checkBMCs:
				p.checkInventoryBMCs(ctx)
			}
		}
	}()
	for sleep.For(ctx, p.removeRetry()) {
		p.reloadMu.Lock()
		if p.kept > 0 {
			inv := p.Inventory()
			res, err := Sync(ctx, p.db, inv, SyncOptions{KeepUnlisted: p.cfg.KeepUnlisted})
			if err != nil {
				klog.FromContext(ctx).Error(err, "Inventory: removing the machines no longer listed failed; trying again", "file", inv.File, "in", p.removeRetry())
			} else {
				p.reportRemovals(klog.FromContext(ctx), inv, res)
			}
		}
		p.reloadMu.Unlock()
	}
	return nil
}

func clipList(ids []string, n int) []string {
	if len(ids) <= n {
		return ids
	}
	return append(ids[:n:n], fmt.Sprintf("... (%d more)", len(ids)-n))
}

// lookup finds m's inventory entry.
func (p *Provider) lookup(m bmdb.Provided) (*Machine, error) {
	if m.Provider != Name {
		return nil, fmt.Errorf("machine %s is provided by %q, not %q", m.Machine, m.Provider, Name)
	}
	inv := p.Inventory()
	e, ok := inv.Machine(m.ProviderID)
	if !ok {
		return nil, backoff.With(fmt.Errorf("%w %s: %s was removed from it; list it again, or let it be removed", ErrNotInInventory, inv.File, m.ProviderID), RemovedBackoff)
	}
	return e, nil
}

func target(m bmdb.Provided, e *Machine) sshagent.Target {
	return sshagent.Target{Machine: m.Machine, Name: Name + "/" + e.ID, Address: e.SSH.Address(), User: e.SSH.User}
}

// StartAgent implements providers.Provider: it uploads and starts the agent
// over SSH.
func (p *Provider) StartAgent(ctx context.Context, m bmdb.Provided) ([]byte, error) {
	e, err := p.lookup(m)
	if err != nil {
		return nil, err
	}
	return p.ssh.StartAgent(ctx, target(m, e))
}

// Reboot implements providers.Provider: through the machine's BMC, over
// Redfish or IPMI, as its inventory entry says (power), else with the
// reboot command over SSH. Errors name the method and the BMC.
func (p *Provider) Reboot(ctx context.Context, m bmdb.Provided) error {
	e, err := p.lookup(m)
	if err != nil {
		return err
	}
	method := e.Power
	switch method {
	case PowerIPMI:
		err = p.ipmi.Reset(ctx, *e.IPMI)
	case PowerRedfish:
		if err = p.redfish.Reset(ctx, *e.Redfish); err != nil {
			err = fmt.Errorf("via redfish at %s: %w", e.Redfish.Endpoint, err)
		}
	default:
		method = PowerSSH
		if err = p.ssh.Reboot(ctx, target(m, e)); err != nil {
			err = fmt.Errorf("via ssh: %w", err)
		}
	}
	p.metrics.attempted(method, err)
	return err
}

var (
	_ providers.PowerReader = (*Provider)(nil)
	_ providers.PowerOner   = (*Provider)(nil)
)

// PowerState implements providers.PowerReader through the machine's BMC,
// as its inventory entry says: IPMI's chassis status or the Redfish
// system's PowerState. A machine rebooted over SSH has no BMC: its error
// wraps providers.ErrPowerUnsupported, and Recovery reboots it as it
// would without power truth.
func (p *Provider) PowerState(ctx context.Context, m bmdb.Provided) (providers.PowerState, error) {
	e, err := p.lookup(m)
	if err != nil {
		return providers.PowerState{}, err
	}
	switch e.Power {
	case PowerIPMI:
		on, err := p.ipmi.PowerStatus(ctx, *e.IPMI)
		if err != nil {
			p.metrics.attempted(e.Power, err)
			return providers.PowerState{}, err
		}
		if on {
			return providers.PowerState{Power: providers.PowerOn, Cause: "ipmi chassis status"}, nil
		}
		return providers.PowerState{Power: providers.PowerOff, Cause: "ipmi chassis status"}, nil
	case PowerRedfish:
		state, err := p.redfish.PowerState(ctx, *e.Redfish)
		if err != nil {
			p.metrics.attempted(e.Power, err)
			return providers.PowerState{}, fmt.Errorf("via redfish at %s: %w", e.Redfish.Endpoint, err)
		}
		switch state {
		case redfish.PowerStateOn:
			return providers.PowerState{Power: providers.PowerOn, Cause: "redfish PowerState On"}, nil
		case redfish.PowerStateOff:
			return providers.PowerState{Power: providers.PowerOff, Cause: "redfish PowerState Off"}, nil
		case "":
			return providers.PowerState{Power: providers.PowerUnknown, Cause: "redfish system reports no PowerState"}, nil
		}
		return providers.PowerState{Power: providers.PowerUnknown, Cause: "redfish PowerState " + untrusted.Line(state, 64)}, nil
	}
	return providers.PowerState{}, fmt.Errorf("%s (power: ssh): %w", e.ID, providers.ErrPowerUnsupported)
}

var _ providers.PowerRecoverer = (*Provider)(nil)

// RecoverPower implements providers.PowerRecoverer: through IPMI in one
// session (chassis status, then power up or the configured reset); through
// Redfish as PowerState, then PowerOn or Reboot (HTTP Basic has no login to
// save). A machine rebooted over SSH has no BMC: its error wraps
// providers.ErrPowerUnsupported. Every attempt that acted, or failed to
// read the power, counts in shepherd_provider_resets_total.
func (p *Provider) RecoverPower(ctx context.Context, m bmdb.Provided) (providers.PowerState, error) {
	e, err := p.lookup(m)
	if err != nil {
		return providers.PowerState{}, err
	}
	switch e.Power {
	case PowerIPMI:
		read, on, err := p.ipmi.Recover(ctx, *e.IPMI)
		p.metrics.attempted(e.Power, err)
		switch {
		case !read:
			return providers.PowerState{}, err
		case on:
			return providers.PowerState{Power: providers.PowerOn, Cause: "ipmi chassis status"}, err
		}
		return providers.PowerState{Power: providers.PowerOff, Cause: "ipmi chassis status"}, err
	case PowerRedfish:
		st, err := p.PowerState(ctx, m)
		if err != nil {
			return st, err
		}
		switch st.Power {
		case providers.PowerOff:
			return st, p.PowerOn(ctx, m)
		case providers.PowerOn:
			return st, p.Reboot(ctx, m)
		}
		return st, nil
	}
	return providers.PowerState{}, fmt.Errorf("%s (power: ssh): %w", e.ID, providers.ErrPowerUnsupported)
}

// PowerOn implements providers.PowerOner through the machine's BMC (IPMI
// chassis power up, Redfish Reset On). A machine without a BMC cannot be
// powered on: its error wraps providers.ErrPowerUnsupported.
func (p *Provider) PowerOn(ctx context.Context, m bmdb.Provided) error {
	e, err := p.lookup(m)
	if err != nil {
		return err
	}
	switch e.Power {
	case PowerIPMI:
		err = p.ipmi.PowerOn(ctx, *e.IPMI)
	case PowerRedfish:
		if err = p.redfish.PowerOn(ctx, *e.Redfish); err != nil {
			err = fmt.Errorf("via redfish at %s: %w", e.Redfish.Endpoint, err)
		}
	default:
		return fmt.Errorf("%s (power: ssh): %w", e.ID, providers.ErrPowerUnsupported)
	}
	p.metrics.attempted(e.Power, err)
	return err
}

var _ providers.ResetDescriber = (*Provider)(nil)

// ResetDescription implements providers.ResetDescriber: the method and
// reset type of m's inventory entry ("ipmi power_cycle", "redfish
// ForceRestart", "ssh reboot"), "" when the inventory no longer lists it.
func (p *Provider) ResetDescription(m bmdb.Provided) string {
	e, ok := p.Inventory().Machine(m.ProviderID)
	if !ok || m.Provider != Name {
		return ""
	}
	switch e.Power {
	case PowerIPMI:
		if e.IPMI.ResetType == "" {
			return PowerIPMI + " " + ipmi.ResetPowerCycle
		}
		return PowerIPMI + " " + e.IPMI.ResetType
	case PowerRedfish:
		if e.Redfish.ResetType == "" {
			return PowerRedfish + " " + redfish.DefaultResetType
		}
		return PowerRedfish + " " + e.Redfish.ResetType
	}
	return PowerSSH + " reboot"
}

// metrics are the inventory's gauges and counters.
type metrics struct {
	machines   prometheus.Gauge
	removed    prometheus.Gauge
	removals   prometheus.Counter
	reloads    *prometheus.CounterVec
	lastReload prometheus.Gauge
	resets     *prometheus.CounterVec
	bmcErrors  *prometheus.CounterVec
	// bmcCheckFailures is set by -inventory_check_bmcs.
	bmcCheckFailures *prometheus.GaugeVec
}

// newMetrics makes the inventory's metrics and registers them with reg
// (nil: not registered).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		machines: metric.Gauge(reg, "shepherd_inventory_machines",
			"Machines listed by the static inventory in force."),
		removed: metric.Gauge(reg, "shepherd_inventory_removed_machines",
			"Machines of the static provider in the BMDB that the inventory in force no longer lists: leased (removed when the lease ends), or kept by -inventory_keep_unlisted."),
		removals: metric.Counter(reg, "shepherd_inventory_machines_removed_total",
			"Machines the static provider removed from the BMDB because the inventory no longer lists them (each recorded as Removed in its history)."),
		reloads: metric.CounterVec(reg, "shepherd_inventory_reloads_total",
			"Inventory loads (start and SIGHUP), by result: success, error (the previous inventory stays in force).", "result"),
		resets: metric.CounterVec(reg, "shepherd_provider_resets_total",
			"Reboots the static provider attempted (a reset of a machine that is on, a power-on of one that is off), by method (redfish, ipmi, ssh) and result (success, failure; a power read that failed, which stops the reboot, counts as a failure).", "method", "result"),
		bmcErrors: metric.CounterVec(reg, "shepherd_bmc_errors_total",
			"Failed power reads and actions through a BMC, by provider (redfish, ipmi) and class (unreachable, credentials, tls, not_found, configuration, busy, other; see docs/real-fleet.md).", "provider", "class"),
		bmcCheckFailures: metric.GaugeVec(reg, "shepherd_inventory_bmc_check_failures",
			"Machines whose BMC failed the last check of the inventory (-inventory_check_bmcs), by class: a reset of them would fail the same way.", "class"),
		lastReload: metric.Gauge(reg, "shepherd_inventory_last_reload_successful",
			"1 if the last inventory load succeeded, 0 if it was rejected (an edited file is not in force)."),
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("error")
	for _, method := range []string{PowerRedfish, PowerIPMI, PowerSSH} {
		m.resets.WithLabelValues(method, "success")
		m.resets.WithLabelValues(method, "failure")
	}
	for _, method := range []string{PowerRedfish, PowerIPMI} {
		for _, class := range bmcerr.Classes {
			m.bmcErrors.WithLabelValues(method, string(class))
		}
	}
	for _, class := range bmcerr.Classes {
		m.bmcCheckFailures.WithLabelValues(string(class))
	}

	return m
}

// attempted counts a reset, power-on or power read through method that
// ended with err (nil: success) in shepherd_provider_resets_total, and a
// BMC's failure in shepherd_bmc_errors_total by its class.
func (m *metrics) attempted(method string, err error) {
	if err == nil {
		m.resets.WithLabelValues(method, "success").Inc()
		return
	}
	m.resets.WithLabelValues(method, "failure").Inc()
	if method == PowerRedfish || method == PowerIPMI {
		m.bmcErrors.WithLabelValues(method, string(bmcerr.Of(err))).Inc()
	}
}

func (m *metrics) reloaded(ok bool) {
	if ok {
		m.reloads.WithLabelValues("success").Inc()
		m.lastReload.Set(1)
		return
	}
	m.reloads.WithLabelValues("error").Inc()
	m.lastReload.Set(0)
}
