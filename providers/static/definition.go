package static

import (
	"context"
	"fmt"

	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/providers"
)

// Definition defines the static provider for a binary to register
// (-provider static): the machines of -inventory, reached over SSH and
// Redfish or IPMI. The inventory is synced into the BMDB at start
// (Prepare) and on SIGHUP (Reload); Run removes the unlisted machines a
// lease kept once their leases end. Its agents heartbeat to the daemon's
// endpoint: -agent_heartbeat_url, or env.HeartbeatURL.
func Definition() providers.Definition {
	cfg := DefaultConfig()
	return providers.Definition{
		Name:  Name,
		Usage: "the machines of -inventory, reached over SSH and Redfish",
		Flags: cfg.RegisterFlags,
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
			if err := c.SSH.Check(); err != nil {
				return nil, fmt.Errorf("-provider static: %w", err)
			}
			p, err := Open(c, env.DB, env.Registerer)
			if err != nil {
				return nil, fmt.Errorf("-provider static: %w", err)
			}
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
