package ipmi

import (
	"errors"
	"regexp"
	"strconv"
	"strings"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
)

// rmcpStatusText finds an RMCP+ status in the library's text of a login
// failure: the library joins the errors of its cipher suite attempts with
// %v, which keeps their text but not the errors themselves.
var rmcpStatusText = regexp.MustCompile(`RMCP\+ status (0x[0-9a-fA-F]{1,2})`)

// noAnswer matches the library's words for a BMC that did not answer
// before its UDP read deadline, or whose socket could not be used.
var noAnswer = regexp.MustCompile(`before (UDP read )?deadline|i/o timeout|connection refused|no route to host`)

// completionCodeText finds an IPMI completion code in the library's text
// of a failed command, for the same reason.
var completionCodeText = regexp.MustCompile(`cc: (0x[0-9a-fA-F]{1,2})`)

// classOf is the class of err, an IPMI action's failure as the library
// (or the guard) returned it: the RMCP+ status of a refused login, the
// completion code of a refused command, or the transport's failure.
func classOf(err error) bmcerr.Class {
	if c := bmcerr.Transport(err); c != bmcerr.Other {
		return c
	}
	var rmcp *types.RmcpStatusError
	var resp *types.ResponseError
	switch {
	case errors.As(err, &rmcp):
		return rmcpClass(rmcp.StatusCode())
	case errors.As(err, &resp):
		return completionClass(resp.CompletionCode())
	case errors.Is(err, client.ErrRAKPAuthentication),
		strings.Contains(err.Error(), client.ErrRAKPAuthentication.Error()):
		// The BMC's RAKP2 does not match the password: wrong password.
		return bmcerr.Credentials
	}
	if noAnswer.MatchString(err.Error()) {
		// The library's own read deadline, which is the action's, may
		// fire a moment before ctx's: the same silence.
		return bmcerr.Unreachable
	}
	if m := rmcpStatusText.FindStringSubmatch(err.Error()); m != nil {
		if n, perr := strconv.ParseUint(m[1], 0, 8); perr == nil {
			return rmcpClass(types.RmcpStatusCode(n))
		}
	}
	if m := completionCodeText.FindStringSubmatch(err.Error()); m != nil {
		if n, perr := strconv.ParseUint(m[1], 0, 8); perr == nil {
			return completionClass(types.CompletionCode(n))
		}
	}
	return bmcerr.Other
}

// rmcpClass is the class of an RMCP+ session setup status (IPMI 2.0
// table 13-15): the name, role or integrity check value refused are the
// credentials; no resources for a session is a busy BMC (its few
// sessions taken); no cipher suite or algorithm match is the inventory's
// cipher_suite.
func rmcpClass(code types.RmcpStatusCode) bmcerr.Class {
	switch code {
	case types.RmcpStatusCodeUnauthorizedName, types.RmcpStatusCodeInvalidRole,
		types.RmcpStatusCodeUnauthorizedRoleOfPriLevel, types.RmcpStatusCodeInvalidIntegrityCheckValue,
		types.RmcpStatusCodeInvalidNameLength, types.RmcpStatusCodeUnauthorizedGUID:
		return bmcerr.Credentials
	case types.RmcpStatusCodeNoResToCreateSess, types.RmcpStatusCodeNoResToCreateSessAtRole:
		return bmcerr.Busy
	case types.RmcpStatusCodeNoCipherSuiteMatch, types.RmcpStatusCodeInvalidAuthAlg,
		types.RmcpStatusCodeInvalidIntegrityAlg, types.RmcpStatusCodeInvalidConfidentAlg:
		return bmcerr.Configuration
	}
	return bmcerr.Other
}

// completionClass is the class of a command's completion code: node busy
// (0xC0) is busy; insufficient privilege (0xD4) is an account that may
// not control the chassis, a credentials matter.
func completionClass(cc types.CompletionCode) bmcerr.Class {
	switch cc {
	case types.CodeNodeBusy:
		return bmcerr.Busy
	case types.CodeInsufficientPrivilege:
		return bmcerr.Credentials
	}
	return bmcerr.Other
}
