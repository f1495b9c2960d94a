package redfish

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// classify wraps err, a failure of a conversation with a BMC, in a
// *bmcerr.Error: the class it already has, else the one its HTTP status
// says (see statusClass), else the transport's (dial, timeout, TLS).
func classify(err error) error {
	if err == nil {
		return nil
	}
	var classified *bmcerr.Error
	if errors.As(err, &classified) {
		return err
	}
	if code := httpStatus(err); code != 0 {
		return bmcerr.WithCode(statusClass(code), code, err)
	}
	return bmcerr.New(bmcerr.Transport(err), err)
}

// httpStatus is the HTTP status of the BMC's answer err reports, 0 if
// none.
func httpStatus(err error) int {
	var status *schemas.Error
	if errors.As(err, &status) {
		return status.HTTPReturnedStatusCode
	}
	return 0
}

// statusClass is the class of a BMC's error answer: 401 and 403 refuse
// the credentials; 404 is a system (or resource) not found; 409, 429 and
// 503 say the BMC cannot act now.
func statusClass(code int) bmcerr.Class {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return bmcerr.Credentials
	case http.StatusNotFound:
		return bmcerr.NotFound
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return bmcerr.Busy
	}
	return bmcerr.Other
}

// final reports whether err ends the search for a system at once: the
// BMC refused the credentials (every further request would be another
// failed login, which BMCs count towards locking the account) or is busy.
func final(err error) bool {
	c := statusClass(httpStatus(err))
	return c == bmcerr.Credentials || c == bmcerr.Busy
}

// ResetPreference is the order in which Shepherd would replace a reset
// type the BMC does not offer, suggested in the error that refuses it:
// ForceRestart first, Shepherd's default, which every BMC we know offers
// and which works whatever the operating system does; then the power
// cycles, which also bring a hung machine back, only slower; and
// GracefulRestart last, which a hung operating system ignores.
//
// Shepherd suggests rather than substitutes: Recovery records the reset
// type it asked for before the reset, and a substitute would make the
// history say what was not sent.
var ResetPreference = []string{"ForceRestart", "PowerCycle", "FullPowerCycle", "GracefulRestart"}

// checkOffered refuses resetType when the system's Reset action lists
// the types it allows (ResetType@Redfish.AllowableValues, or its
// ActionInfo) and resetType is not among them: refused says so, and err
// is a configuration error to wrap. A system that lists none is sent
// resetType as it is. A failure to read the ActionInfo is err, refused
// false.
func checkOffered(system *schemas.ComputerSystem, resetType string) (refused bool, err error) {
	offered, err := system.GetSupportedResetTypes()
	if err != nil {
		return false, fmt.Errorf("reading the reset types it offers: %w", err)
	}
	if len(offered) == 0 || slices.Contains(offered, schemas.ResetType(resetType)) {
		return false, nil
	}
	msg := "reset type " + short(resetType) + " is not offered by system " + short(system.ID) +
		" (it offers " + names(offered, func(t schemas.ResetType) string { return string(t) }) + ")"
	if slices.Contains(ResetTypes, resetType) {
		for _, alt := range ResetPreference {
			if alt != resetType && slices.Contains(offered, schemas.ResetType(alt)) {
				msg += ": set redfish.reset_type: " + alt + " in the inventory"
				break
			}
		}
	}
	return true, errors.New(msg)
}
