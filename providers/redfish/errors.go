package redfish

import "errors"

// ErrCleartext refuses an http:// endpoint not explicitly allowed.
var ErrCleartext = errors.New("http:// would send the BMC's password in cleartext: use https://, or set redfish.allow_http: true for this machine")

// ErrConversationBound is wrapped by the error of an action whose
// conversation with the BMC went beyond maxRequests or maxTotalBytes.
var ErrConversationBound = errors.New("redfish: BMC conversation exceeded")

// ErrForeignHost is wrapped by the error of a request refused because it
// was not for the BMC's endpoint.
var ErrForeignHost = errors.New("refusing a request that is not for the BMC's endpoint")
