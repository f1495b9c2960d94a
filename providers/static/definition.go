package static

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/providers"
)

// Definition defines the static provider for a binary to register
// (-provider static): the machines of -inventory, reached over SSH and
// Redfish or IPMI. The inventory is synced into the BMDB at start
// (Prepare) and on SIGHUP (Reload); Run removes the unlisted machines a
// lease kept once their leases end. Its agents heartbeat to the daemon's
// endpoint: -agent_heartbeat_url, or env.HeartbeatURL (HeartbeatURLFlag).
func Definition() providers.Definition {
	cfg := DefaultConfig()
	return providers.Definition{
		Name:             Name,
		Usage:            "the machines of -inventory, reached over SSH and Redfish",
		Flags:            cfg.RegisterFlags,
		Preparing:        "syncing the inventory into the BMDB",
		HeartbeatURLFlag: "agent_heartbeat_url",
		Check: func() error {
			c := cfg
			if c.SSH.HeartbeatURL == "" {
				// The daemon's own endpoint, known at New: checked
				// there. The placeholder lets the rest be checked now.
				c.SSH.HeartbeatURL = "http://heartbeat.invalid" + heartbeat.Path
			}
			return c.Check()
		},
		New: func(env providers.Env) (providers.Provider, error) {
			c := cfg
			if c.SSH.HeartbeatURL == "" {
				c.SSH.HeartbeatURL = env.HeartbeatURL
			}
			// Errors name the flag; the daemon adds "-provider static".
			if err := c.SSH.Check(); err != nil {
				return nil, err
			}
			p, err := Open(c, env.DB, env.Registerer)
			if err != nil {
				return nil, err
			}
			log := env.Logger
			if log.GetSink() == nil {
				log = logr.Discard()
			}
			log.Info("Static provider: inventory loaded; agents will send heartbeats to heartbeat_url",
				"file", c.InventoryFile, "machines", len(p.Inventory().Machines), "heartbeat_url", c.SSH.HeartbeatURL)
			log.Info("Static provider: logging in with -ssh_key_file, whose public key the machines' login users must authorize",
				"ssh_key_file", c.SSH.KeyFile, "public_key", p.SSHPublicKey())
			return p, nil
		},
	}
}

// Prepare implements providers.Preparer: it syncs the inventory into the
// BMDB.
func (p *Provider) Prepare(ctx context.Context) error { return p.Sync(ctx) }

var (
	_ providers.Preparer = (*Provider)(nil)
	_ providers.Runner   = (*Provider)(nil)
	_ providers.Reloader = (*Provider)(nil)
)
