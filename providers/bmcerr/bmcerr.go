// Package bmcerr classifies the failures of a conversation with a BMC, so
// that each kind can be told apart by the code that decides what to do next
// (back off short for a BMC that did not answer, stop for credentials it
// refused) and by the operators who read the cause: "BMC unreachable" for
// a 401 sends them to the network when the password is wrong.
//
// A provider wraps each BMC failure in an *Error carrying its Class; Of
// finds the class again through any wrapping, and the error's text opens
// with the class's wording.
package bmcerr

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// Class is a kind of BMC failure. Its value is stable: it labels the
// metric shepherd_bmc_errors_total and may be stored.
type Class string

// The classes, from the most to the least specific.
const (
	// Unreachable: the BMC did not answer (connection refused, no route,
	// timeout). Usually transient, often shared by a rack.
	Unreachable Class = "unreachable"
	// Credentials: the BMC refused the account (HTTP 401 or 403, IPMI
	// authentication failed). Retrying costs failed logins, which BMCs
	// count towards locking the account.
	Credentials Class = "credentials"
	// TLS: the BMC's certificate could not be verified against the
	// configured CA. Not transient: the CA file or the BMC must change.
	TLS Class = "tls"
	// NotFound: the BMC answered but manages no such system.
	NotFound Class = "not_found"
	// Configuration: the inventory asks for what the BMC does not offer
	// (a reset type outside its allowable values), or cannot be used as
	// written (a credentials or CA file that cannot be read, a cleartext
	// endpoint): fixed by editing the inventory, not by retrying.
	Configuration Class = "configuration"
	// Busy: the BMC answered that it cannot act now (HTTP 409 or 503,
	// IPMI node busy). Transient.
	Busy Class = "busy"
	// Other: any other failure.
	Other Class = "other"
)

// Classes lists every class, in the order above.
var Classes = []Class{Unreachable, Credentials, TLS, NotFound, Configuration, Busy, Other}

// Wording is the class as a cause shows it.
func (c Class) Wording() string {
	switch c {
	case Unreachable:
		return "BMC unreachable"
	case Credentials:
		return "BMC refused the credentials"
	case TLS:
		return "BMC's TLS certificate not verified"
	case NotFound:
		return "system not found on the BMC"
	case Configuration:
		return "BMC configuration error"
	case Busy:
		return "BMC busy"
	}
	return "BMC error"
}

// Error is a BMC failure of a known class. Err is the failure as the
// provider describes it; Code, when not 0, is the protocol's status (an
// HTTP status, an IPMI completion code) that decided the class.
type Error struct {
	Class Class
	Code  int
	Err   error
}

// Error renders the class's wording, the code, then the cause:
// "BMC refused the credentials (401): ...".
func (e *Error) Error() string {
	w := e.Class.Wording()
	if e.Code != 0 {
		w = fmt.Sprintf("%s (%d)", w, e.Code)
	}
	if e.Err == nil {
		return w
	}
	return w + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// New wraps err in an Error of class c (code 0). A nil err stays nil, and
// an err already classified keeps its class.
func New(c Class, err error) error {
	return WithCode(c, 0, err)
}

// WithCode is New with the status that decided the class.
func WithCode(c Class, code int, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Class: c, Code: code, Err: err}
}

// Of returns the class of err: that of the first *Error in its chain,
// Other for any other error, "" for nil.
func Of(err error) Class {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return Other
}

// Transport classifies an error of a connection to a BMC: TLS for a
// certificate that did not verify, Unreachable for a dial failure or a
// timeout (a context deadline included), Other otherwise. Cancellation
// (context.Canceled) is Other: Shepherd gave up, the BMC did not fail.
func Transport(err error) Class {
	var (
		unknown   x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		hostname  x509.HostnameError
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		opErr     *net.OpError
		dnsErr    *net.DNSError
		netErr    net.Error
		alert     tls.AlertError
		errSystem *x509.SystemRootsError
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &hostname),
		errors.As(err, &verify), errors.As(err, &record), errors.As(err, &alert), errors.As(err, &errSystem):
		return TLS
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return Unreachable
	case errors.As(err, &dnsErr), errors.As(err, &opErr):
		return Unreachable
	case errors.As(err, &netErr) && netErr.Timeout():
		return Unreachable
	}
	return Other
}
