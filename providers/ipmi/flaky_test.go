package ipmi

import (
	"context"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// Through a relay that loses packets in front of a real BMC (ipmi_sim): a
// BMC behind a lossless relay answers, one behind a relay losing every
// packet is unreachable, and it answers again once the packets pass.
func TestLossyNetworkUnreachable(t *testing.T) {
	t.Parallel()
	sim := ipmisimtest.Start(t)
	proxy := sim.StartProxy(t)
	target := Target{Address: proxy.Host, Port: proxy.Port, CredentialsFile: sim.WriteCredentials(t, t.TempDir(), "")}
	ctx := context.Background()
	if _, err := New(DefaultConfig()).PowerStatus(ctx, target); err != nil {
		t.Fatalf("power read through a lossless relay: %v", err)
	}
	proxy.SetDrop(1)
	// A short timeout: the lost packets cost all of it.
	if _, err := New(Config{Timeout: time.Second}).PowerStatus(ctx, target); bmcerr.Of(err) != bmcerr.Unreachable {
		t.Errorf("power read with every packet lost: %v (class %q), want unreachable", err, bmcerr.Of(err))
	}
	if _, dropped := proxy.Counts(); dropped == 0 {
		t.Errorf("the relay dropped no packet")
	}
	proxy.SetDrop(0)
	if _, err := New(DefaultConfig()).PowerStatus(ctx, target); err != nil {
		t.Errorf("power read once the packets pass again: %v", err)
	}
}
