package shepherdcli

import (
	"flag"
	"io"
	"log/slog"
	"strconv"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// useJSONLogs sends klog's output, the contextual loggers of tasks
// included, through the standard library's JSON handler: one object a
// line, with each structured key (process, machine, provider_id, session,
// result, cause) a field, for a log pipeline. klog's -v sets the verbosity
// as for text: V(n) lines are written when n <= -v.
func useJSONLogs(w io.Writer, fs *flag.FlagSet) {
	v := 0
	if f := fs.Lookup("v"); f != nil {
		v, _ = strconv.Atoi(f.Value.String())
	}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(-v)})
	klog.SetLogger(logr.FromSlogHandler(h))
}
