package ipmi

import "errors"

// errMalformed marks a packet the guard refused.
var errMalformed = errors.New("malformed reply from the BMC")

// errLibraryFailed opens the cause of an action during which the IPMI
// library panicked on what the BMC sent (a bug of the library's, reached
// by a broken or hostile BMC past the guard).
var errLibraryFailed = errors.New("BMC protocol library failed on the BMC's reply")
