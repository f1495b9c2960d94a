package ipmi

import (
	"context"
	"fmt"

	"github.com/bougou/go-ipmi/pkg/client"
)

// Inspection is what Inspect read from a BMC, without acting on it.
type Inspection struct {
	// On reports the chassis power, from its status.
	On bool
	// ResetType is the reset a reboot would send (the inventory's, or
	// ResetPowerCycle).
	ResetType string
	// Offered are the reset types the client can send: IPMI's chassis
	// control has a fixed set, which every BMC implements.
	Offered []string
	// Firmware is the BMC's firmware revision from Get Device ID
	// ("BMC 2.15"), "" when the BMC did not answer it: the check is about
	// the session and the chassis, not the revision.
	Firmware string
}

// Inspect logs in to t's BMC in one session, as a reset would (same
// credentials, cipher suite, privilege and bounds), and reads the chassis
// status and the BMC's firmware revision, sending no chassis control. The
// error is classified as Reset's would be; an unknown reset type is a
// bmcerr.Configuration error, found before any login.
func (c *Client) Inspect(ctx context.Context, t Target) (Inspection, error) {
	in := Inspection{ResetType: resetName(t.ResetType), Offered: ResetTypes}
	if _, err := resetControl(t.ResetType); err != nil {
		return in, err
	}
	err := c.do(ctx, t, "inspecting", func(ctx context.Context, cl *client.Client) error {
		st, err := cl.GetChassisStatus(ctx)
		if err != nil {
			return fmt.Errorf("reading the chassis status: %w", err)
		}
		in.On = st.PowerIsOn
		if id, err := cl.GetDeviceID(ctx); err == nil {
			in.Firmware = fmt.Sprintf("BMC %d.%02x", id.MajorFirmwareRevision&0x7f, id.MinorFirmwareRevision)
		}
		return nil
	})
	return in, err
}
