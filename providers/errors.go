package providers

import "errors"

// ErrPowerUnsupported is wrapped by the errors of PowerState and PowerOn
// for a machine that has no way to read or switch its power (a machine of
// the static provider rebooted over SSH): the caller then acts as it would
// without power truth, and says so.
var ErrPowerUnsupported = errors.New("cannot read or switch this machine's power (no BMC)")
