package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
)

// PowerUnknownBackoff is the backoff of a machine whose power could not be
// read (its BMC did not answer, or answered with a state that is neither on
// nor off). Recovery does not act blind on it: a reset sent to a BMC that
// cannot say whether the machine is on is as likely lost as done. A BMC
// that is down or rebooting is seldom back within a minute, and one whose
// network is broken needs a person: it is asked again after 5 minutes, then
// less and less often, up to every 4 hours.
var PowerUnknownBackoff = bmdb.Backoff{Initial: 5 * time.Minute, Maximum: 4 * time.Hour, Exponent: 2, Jitter: controlloop.DefaultBackoffJitter}

// Seen is what a run of Recovery read of a machine's power and what it did
// about it.
type Seen struct {
	// Power is the state read; empty when it could not be read (Cause
	// says why) or the provider cannot read power.
	Power providers.Power
	// Cause is what the provider said of the state, or why it has none.
	Cause string
	// Done says what was seen and done, for history: "power was off;
	// powered on", "power was on; reset (ipmi power_cycle)".
	Done string
}

// powerAct reads the machine's power and acts on it: a machine that is off
// is powered on (a power cycle of a chassis that is off does nothing on
// most BMCs, which still report success), one that is on is reset as its
// provider is configured to. A state that is neither, or a BMC that does
// not answer, fails the run (PowerUnknownBackoff): the machine is not
// acted on blind. A provider that cannot read power (or not for this
// machine) reboots it as before power was read.
func (r *Recovery) powerAct(ctx context.Context, m bmdb.Provided) (Seen, error) {
	reader, ok := r.provider.(providers.PowerReader)
	if !ok {
		if err := r.reboot(ctx, m); err != nil {
			return Seen{}, err
		}
		return Seen{Done: "power not read (the provider cannot); " + r.resetName(m)}, nil
	}
	st, err := reader.PowerState(ctx, m)
	seen := Seen{Power: st.Power, Cause: st.Cause}
	switch {
	case errors.Is(err, providers.ErrPowerUnsupported):
		seen = Seen{}
		if err := r.reboot(ctx, m); err != nil {
			return seen, err
		}
		seen.Done = "power not read (no BMC); " + r.resetName(m)
		return seen, nil
	case err != nil:
		if ctx.Err() != nil {
			// The run was stopped or timed out: no verdict on the BMC.
			return Seen{}, fmt.Errorf("reading the power of %s/%s: %w", m.Provider, m.ProviderID, err)
		}
		seen.Power, seen.Cause = providers.PowerUnknown, "BMC unreachable: "+err.Error()
		return seen, controlloop.WithBackoff(fmt.Errorf("power state unknown, not acted on: reading it failed: %w", err), PowerUnknownBackoff)
	}
	switch st.Power {
	case providers.PowerOff:
		oner, ok := r.provider.(providers.PowerOner)
		if !ok {
			if err := r.reboot(ctx, m); err != nil {
				return seen, fmt.Errorf("power was off; the provider cannot power on: %w", err)
			}
			seen.Done = "power was off; the provider cannot power on: " + r.resetName(m)
			return seen, nil
		}
		if err := oner.PowerOn(ctx, m); err != nil {
			return seen, fmt.Errorf("power was off; powering on %s/%s: %w", m.Provider, m.ProviderID, err)
		}
		seen.Done = "power was off; powered on"
		return seen, nil
	case providers.PowerOn:
		if err := r.reboot(ctx, m); err != nil {
			return seen, fmt.Errorf("power was on; %w", err)
		}
		seen.Done = "power was on; " + r.resetName(m)
		return seen, nil
	}
	seen.Power = providers.PowerUnknown
	cause := st.Cause
	if cause == "" {
		cause = "the BMC gave no state"
	}
	seen.Cause = cause
	return seen, controlloop.WithBackoff(fmt.Errorf("power state unknown (%s), not acted on", cause), PowerUnknownBackoff)
}

// reboot reboots the machine through the provider.
func (r *Recovery) reboot(ctx context.Context, m bmdb.Provided) error {
	if err := r.provider.Reboot(ctx, m); err != nil {
		return fmt.Errorf("rebooting %s/%s: %w", m.Provider, m.ProviderID, err)
	}
	return nil
}

// resetName says how the provider reboots m: "reset (ipmi power_cycle)",
// or "rebooted" when it does not say.
func (r *Recovery) resetName(m bmdb.Provided) string {
	if d, ok := r.provider.(providers.ResetDescriber); ok {
		if s := d.ResetDescription(m); s != "" {
			return "reset (" + s + ")"
		}
	}
	return "rebooted"
}

// recordPower records the power state read (if any) in machine_power, in
// a transaction of its own, for operators: 'machines -all', -o json and
// the status page show it. A failure to record is logged and costs the
// run nothing: the state is shown, not used.
func (r *Recovery) recordPower(ctx context.Context, t *controlloop.Task, seen Seen) {
	if seen.Power == "" || ctx.Err() != nil {
		return
	}
	err := t.Transact(ctx, func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.RecordPower(ctx, t.Machine, string(seen.Power), seen.Cause)
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "recording the power state read failed", "power", seen.Power)
	}
}
