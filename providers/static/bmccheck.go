package static

import (
	"context"
	"slices"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
	"github.com/shepherd-fleet/shepherd/providers/ipmi"
	"github.com/shepherd-fleet/shepherd/providers/redfish"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// BMCCheck is what a check of one machine's BMC found (CheckBMC): the
// operator's "bmc check" row, and what -inventory_check_bmcs logs.
type BMCCheck struct {
	ProviderID string `json:"provider_id"`
	Location   string `json:"location,omitempty"`
	// Method is the machine's power key: redfish, ipmi or ssh.
	Method string `json:"method"`
	// BMC is the BMC's endpoint (ipmi://host:port for IPMI).
	BMC   string `json:"bmc,omitempty"`
	Power string `json:"power,omitempty"`
	// ResetType is the reset a reboot would ask for; ResetOK is false
	// when the BMC does not offer it, and Offered what it offers.
	ResetType string   `json:"reset_type,omitempty"`
	ResetOK   bool     `json:"reset_type_offered"`
	Offered   []string `json:"offered_reset_types,omitempty"`
	Firmware  string   `json:"firmware,omitempty"`
	// Result is "ok", "skipped" (no BMC) or the failure's bmcerr class.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
}

// Failed reports whether the check found a problem.
func (c BMCCheck) Failed() bool { return c.Result != "ok" && c.Result != "skipped" }

// BMCCheckParallel is how many BMCs CheckBMCs talks to at once: enough
// for a rack in a few timeouts, few enough not to look like a burst to a
// chassis manager shared by several machines.
const BMCCheckParallel = 8

// CheckBMCs checks each machine's BMC, BMCCheckParallel at a time, and
// returns the checks in the machines' order.
func CheckBMCs(ctx context.Context, rf *redfish.Client, ip *ipmi.Client, machines []Machine) []BMCCheck {
	checks := make([]BMCCheck, len(machines))
	sem := make(chan struct{}, BMCCheckParallel)
	var wg sync.WaitGroup
	for i, m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			checks[i] = CheckBMC(ctx, rf, ip, m)
		}()
	}
	wg.Wait()
	return checks
}

// CheckBMC talks once to m's BMC, as a reset would, and acts on nothing:
// it reads the power state, the reset types offered and the firmware, and
// reports the credentials, TLS or reset type that would fail a reset.
func CheckBMC(ctx context.Context, rf *redfish.Client, ip *ipmi.Client, m Machine) BMCCheck {
	c := BMCCheck{ProviderID: m.ID, Location: m.Location, Method: m.Power, ResetOK: true}
	var err error
	switch m.Power {
	case PowerRedfish:
		c.BMC = m.Redfish.Endpoint
		var in redfish.Inspection
		in, err = rf.Inspect(ctx, *m.Redfish)
		c.Power, c.ResetType, c.Offered, c.Firmware = in.PowerState, in.ResetType, in.Offered, in.Firmware
	case PowerIPMI:
		c.BMC = "ipmi://" + m.IPMI.Endpoint()
		var in ipmi.Inspection
		in, err = ip.Inspect(ctx, *m.IPMI)
		c.ResetType, c.Offered, c.Firmware = in.ResetType, in.Offered, in.Firmware
		if err == nil {
			c.Power = map[bool]string{true: "On", false: "Off"}[in.On]
		}
	default:
		c.Result, c.Error = "skipped", "no BMC (power: ssh)"
		return c
	}
	if err == nil {
		c.Result = "ok"
		return c
	}
	c.Result = string(bmcerr.Of(err))
	c.Error = untrusted.Line(strings.TrimSpace(err.Error()), 500)
	if bmcerr.Of(err) == bmcerr.Configuration && len(c.Offered) > 0 && !slices.Contains(c.Offered, c.ResetType) {
		c.ResetOK = false
	}
	return c
}

// checkInventoryBMCs checks every BMC of the inventory in force
// (-inventory_check_bmcs), logs each problem and sets the gauge
// shepherd_inventory_bmc_check_failures by class.
func (p *Provider) checkInventoryBMCs(ctx context.Context) {
	inv := p.Inventory()
	logger := klog.FromContext(ctx)
	checks := CheckBMCs(ctx, p.redfish, p.ipmi, inv.Machines)
	if ctx.Err() != nil {
		return
	}
	failed := map[bmcerr.Class]int{}
	for _, c := range checks {
		if c.Failed() {
			failed[bmcerr.Class(c.Result)]++
			logger.Error(nil, "BMC check failed: a reset of this machine would fail", "provider_id", c.ProviderID, "bmc", c.BMC, "class", c.Result, "cause", c.Error)
		}
	}
	for _, class := range bmcerr.Classes {
		p.metrics.bmcCheckFailures.WithLabelValues(string(class)).Set(float64(failed[class]))
	}
	logger.Info("BMC check of the inventory done", "file", inv.File, "machines", len(checks), "failed", sum(failed))
}

func sum(m map[bmcerr.Class]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
