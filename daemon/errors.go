package daemon

import "errors"

// ErrShutdownTimeout is wrapped by Run's error when the stop took longer
// than Options.GracefulShutdownTimeout: the parts that had not returned
// (named in the error and the log) were abandoned. The command line exits
// with status 4 for it.
var ErrShutdownTimeout = errors.New("the stop overran the shutdown timeout")
