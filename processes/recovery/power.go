package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/providers"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

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
// not answer, fails the run with the process's backoff, and the cause says
// so: the machine is not acted on blind (a reset sent to a BMC that cannot
// say whether the machine is on is as likely lost as done). A provider
// that cannot read power (or not for this machine) reboots it as before
// power was read, and the cause says that too.
func (r *Recovery) powerAct(ctx context.Context, m bmdb.Provided) (Seen, error) {
	if pr, ok := r.provider.(providers.PowerRecoverer); ok {
		return r.recoverPower(ctx, pr, m)
	}
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
		return r.unread(ctx, m, err)
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
	return unknown(seen, st)
}

// recoverPower is powerAct through a provider that reads and acts in one
// conversation with the BMC.
func (r *Recovery) recoverPower(ctx context.Context, pr providers.PowerRecoverer, m bmdb.Provided) (Seen, error) {
	st, err := pr.RecoverPower(ctx, m)
	seen := Seen{Power: st.Power, Cause: st.Cause}
	switch {
	case errors.Is(err, providers.ErrPowerUnsupported):
		if err := r.reboot(ctx, m); err != nil {
			return Seen{}, err
		}
		return Seen{Done: "power not read (no BMC); " + r.resetName(m)}, nil
	case st.Power == "" && err != nil:
		return r.unread(ctx, m, err)
	case st.Power == providers.PowerOff && err != nil:
		return seen, fmt.Errorf("power was off; powering on %s/%s: %w", m.Provider, m.ProviderID, err)
	case st.Power == providers.PowerOn && err != nil:
		return seen, fmt.Errorf("power was on; rebooting %s/%s: %w", m.Provider, m.ProviderID, err)
	case st.Power == providers.PowerOff:
		seen.Done = "power was off; powered on"
		return seen, nil
	case st.Power == providers.PowerOn:
		seen.Done = "power was on; " + r.resetName(m)
		return seen, nil
	}
	return unknown(seen, st)
}

// unread is the failure of a run that could not read the power: the
// machine is not acted on blind. A run stopped or timed out says so
// instead, and records no state.
func (r *Recovery) unread(ctx context.Context, m bmdb.Provided, err error) (Seen, error) {
	if ctx.Err() != nil {
		return Seen{}, fmt.Errorf("reading the power of %s/%s: %w", m.Provider, m.ProviderID, err)
	}
	seen := Seen{Power: providers.PowerUnknown, Cause: readFailure(err)}
	return seen, fmt.Errorf("power state unknown, not acted on: reading it failed: %w", err)
}

// readFailure is the recorded cause of a failed power read: the error as
// the provider classified it (credentials refused, TLS not verified,
// unreachable, ...), opened by its class's wording when the provider's
// text does not carry it, so that a wrong password is not recorded as an
// unreachable BMC.
func readFailure(err error) string {
	text := err.Error()
	if w := bmcerr.Of(err).Wording(); !strings.Contains(text, w) {
		return w + ": " + text
	}
	return text
}

// unknown is the failure of a run that read a state that is neither on
// nor off (Redfish's PoweringOn): the machine is not acted on.
func unknown(seen Seen, st providers.PowerState) (Seen, error) {
	seen.Power = providers.PowerUnknown
	cause := st.Cause
	if cause == "" {
		cause = "the BMC gave no state"
	}
	seen.Cause = cause
	return seen, fmt.Errorf("power state unknown (%s), not acted on", cause)
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
	err := t.Transact(ctx, func(ctx context.Context, tx bmdb.Tx) error {
		return tx.RecordPower(ctx, t.Machine, string(seen.Power), seen.Cause)
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Recording the power state read failed", "power", seen.Power)
	}
}
