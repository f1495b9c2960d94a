package shepherdcli

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// fingerprint names an authorized_keys-format host key as ssh-keygen -l and
// ssh's own prompts do: type and SHA256 fingerprint.
func fingerprint(key string) string {
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key))
	if err != nil {
		return "an unparsable key"
	}
	return pub.Type() + " " + ssh.FingerprintSHA256(pub)
}

// hostKeyJSON is a pinned host key in JSON.
type hostKeyJSON struct {
	Machine     uuid.UUID `json:"machine"`
	Provider    string    `json:"provider,omitempty"`
	ProviderID  string    `json:"provider_id,omitempty"`
	Address     string    `json:"address,omitempty"`
	Fingerprint string    `json:"fingerprint"`
	Key         string    `json:"key"`
	PinnedAt    time.Time `json:"pinned_at"`
}

func (c *cli) hostKey(ctx context.Context, args []string) error {
	switch {
	case args[0] == "list" && len(args) == 1:
		return c.hostKeyList(ctx)
	case args[0] == "forget" && len(args) == 2:
		if strings.TrimSpace(c.opts.reason) == "" {
			return usagef("hostkey forget needs -reason: it is recorded for whoever looks at this next")
		}
		return c.hostKeyForget(bmdb.WithActor(ctx, operatorActor(c.opts.hold.as)), args[1])
	}
	return usagef("usage: shepherd hostkey forget MACHINE -reason R | shepherd hostkey list")
}

func (c *cli) hostKeyForget(ctx context.Context, arg string) error {
	id, err := c.machine(ctx, arg)
	if err != nil {
		return err
	}
	k, err := c.db.ForgetSSHHostKey(ctx, id, c.opts.reason, fingerprint)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(hostKeyJSON{Machine: id, Fingerprint: fingerprint(k.Key), Key: k.Key, PinnedAt: k.PinnedAt})
	}
	c.printf("Forgot the SSH host key of %s (%s, pinned %s): the next connection pins the key the machine presents then. Clear its AgentStart backoff to connect now: shepherd backoff clear %s agentstart -reason ...\n",
		id, fingerprint(k.Key), when(k.PinnedAt), arg)
	return nil
}

func (c *cli) hostKeyList(ctx context.Context) error {
	keys, err := c.db.SSHHostKeys(ctx, "", "", c.opts.limit)
	if err != nil {
		return err
	}
	if c.json {
		return c.emitJSON(jsonList(keys, func(k bmdb.PinnedHostKey) hostKeyJSON {
			return hostKeyJSON{k.Machine, k.Provider, k.ProviderID, k.Address, fingerprint(k.Key), k.Key, k.PinnedAt}
		}))
	}
	var rows [][]string
	for _, k := range keys {
		rows = append(rows, []string{k.Machine.String(), k.Provider, k.ProviderID, k.Address, fingerprint(k.Key), when(k.PinnedAt)})
	}
	return c.table([]string{"MACHINE", "PROVIDER", "PROVIDER ID", "ADDRESS", "FINGERPRINT", "PINNED"}, rows)
}
