package redfish

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Inspection is what Inspect read from a BMC, without acting on it: what
// an operator checks before any machine needs recovery.
type Inspection struct {
	// SystemID is the Id of the system found (the inventory's system_id
	// resolved).
	SystemID string
	// PowerState is the system's PowerState ("" when it reports none).
	PowerState string
	// ResetType is the reset type a reboot would ask for (the inventory's,
	// or DefaultResetType).
	ResetType string
	// Offered are the reset types the system lists (its
	// ResetType@Redfish.AllowableValues or ActionInfo); empty when it
	// lists none, and every type is then sent as configured.
	Offered []string
	// Firmware is the firmware version: the managing BMC's FirmwareVersion
	// ("BMC 1.2.3"), else the system's BiosVersion ("BIOS 2.3"), else "".
	Firmware string
}

// maxInspectText bounds each string an Inspection takes from the BMC.
const maxInspectText = 64

// Inspect reads the system behind t in one conversation, as a reset
// would find it (same credentials, TLS, system resolution and bounds),
// but sends no action: its power state, the reset types it offers and
// its firmware version. The error is classified as Reset's would be; a
// configured reset type the system does not offer is an error of class
// bmcerr.Configuration returned with the Inspection filled in.
func (c *Client) Inspect(ctx context.Context, t Target) (Inspection, error) {
	in := Inspection{ResetType: t.ResetType}
	if in.ResetType == "" {
		in.ResetType = DefaultResetType
	}
	err := c.withSystem(ctx, t, func(system *schemas.ComputerSystem, endpoint string, conv *conversation) error {
		in.SystemID = untrusted.Line(system.ID, maxInspectText)
		in.PowerState = untrusted.Line(string(system.PowerState), maxInspectText)
		in.Firmware = firmware(system)
		offered, err := system.GetSupportedResetTypes()
		if err != nil {
			return classify(fmt.Errorf("system %s at %s: reading the reset types it offers: %w", short(system.ID), endpoint, conv.cause(ctx, err)))
		}
		for _, o := range offered {
			if len(in.Offered) < maxSystems {
				in.Offered = append(in.Offered, untrusted.Line(string(o), maxInspectText))
			}
		}
		// The same judgement, and words, as a reset's.
		if refused, err := checkOffered(system, in.ResetType); refused {
			return bmcerr.New(bmcerr.Configuration, fmt.Errorf("at %s: %w", endpoint, err))
		}
		return nil
	})
	return in, err
}

// firmware is the version of the BMC managing system (its first
// ManagedBy link's FirmwareVersion), else the system's BiosVersion, else
// "". A manager that cannot be read only falls back: the check is about
// the system.
func firmware(system *schemas.ComputerSystem) string {
	var links struct {
		Links struct {
			ManagedBy []struct {
				ODataID string `json:"@odata.id"`
			}
		}
	}
	if json.Unmarshal(system.RawData, &links) == nil && len(links.Links.ManagedBy) > 0 && links.Links.ManagedBy[0].ODataID != "" {
		var manager struct{ FirmwareVersion string }
		if getJSON(system.GetClient(), links.Links.ManagedBy[0].ODataID, &manager) == nil && manager.FirmwareVersion != "" {
			return "BMC " + untrusted.Line(manager.FirmwareVersion, maxInspectText)
		}
	}
	if system.BiosVersion != "" {
		return "BIOS " + untrusted.Line(system.BiosVersion, maxInspectText)
	}
	return ""
}
