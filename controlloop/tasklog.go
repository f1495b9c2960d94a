package controlloop

import (
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// taskLogs makes the loggers of a runner's tasks: the Run's logger with the
// keys an operator searches a task's lines by (process, machine,
// provider_id, session). Most tasks never log a line, so a task's logger
// adds its keys when it first writes one (taskSink) rather than when the
// task starts: adding them is several allocations, which every cycle paid
// and the garbage collector then reclaimed.
type taskLogs struct {
	run klog.Logger
	// enabled answers Enabled for the tasks' sinks before they add their
	// keys: the Run's sink, told of the frame taskSink adds, for sinks
	// that look at their caller's file (klog's -vmodule). Nil when the
	// Run's logger discards everything.
	enabled logr.LogSink
	// helper marks its caller as a logging helper, for sinks that write
	// through testing.T (ktesting): a no-op for the others.
	helper func()
}

func newTaskLogs(run klog.Logger) *taskLogs {
	l := &taskLogs{run: run, helper: func() {}}
	if sink := run.GetSink(); sink != nil {
		l.enabled = withCallDepth(sink, 1)
		if h, ok := sink.(logr.CallStackHelperLogSink); ok {
			l.helper = h.GetCallStackHelper()
		}
	}
	return l
}

// logger is the logger of t's lines.
func (l *taskLogs) logger(r *Runner, t *Task) klog.Logger {
	if l.enabled == nil {
		return l.run
	}
	return l.run.WithSink(&taskSink{logs: l, label: r.info.Label, t: t})
}

// taskSink is a task's logr.LogSink: the Run's sink, given the task's keys
// when a line is first written or a logger derived.
type taskSink struct {
	logs  *taskLogs
	label string
	t     *Task

	once sync.Once
	// withKeys is the Run's sink with the task's keys, for derived
	// loggers (WithValues, WithName), which call it directly; direct is
	// withKeys told of taskSink's own frame, for the lines taskSink
	// passes on.
	withKeys, direct logr.LogSink
}

// keys are the values a task's lines carry, in their order.
func (s *taskSink) keys() []any {
	return []any{"process", s.label, "machine", s.t.Machine, "provider_id", s.t.ProviderID, "session", s.t.work.Session().ID()}
}

// materialize gives the sink the task's keys, once.
func (s *taskSink) materialize() {
	s.once.Do(func() {
		s.withKeys = s.logs.run.GetSink().WithValues(s.keys()...)
		s.direct = withCallDepth(s.withKeys, 1)
	})
}

// Init is not called: the sink is set with Logger.WithSink, after the
// Run's sink was initialised.
func (s *taskSink) Init(logr.RuntimeInfo) {}

func (s *taskSink) Enabled(level int) bool { return s.logs.enabled.Enabled(level) }

func (s *taskSink) Info(level int, msg string, keysAndValues ...any) {
	s.logs.helper()
	s.materialize()
	s.direct.Info(level, msg, keysAndValues...)
}

func (s *taskSink) Error(err error, msg string, keysAndValues ...any) {
	s.logs.helper()
	s.materialize()
	s.direct.Error(err, msg, keysAndValues...)
}

func (s *taskSink) WithValues(keysAndValues ...any) logr.LogSink {
	s.materialize()
	return s.withKeys.WithValues(keysAndValues...)
}

func (s *taskSink) WithName(name string) logr.LogSink {
	s.materialize()
	return s.withKeys.WithName(name)
}

// WithCallDepth serves process code's logging helpers
// (logr.Logger.WithCallDepth): the sink returned is called directly.
func (s *taskSink) WithCallDepth(depth int) logr.LogSink {
	s.materialize()
	return withCallDepth(s.withKeys, depth)
}

// GetCallStackHelper lets logr.Logger mark its own frame as a helper, as
// it does for the Run's sink (logr.CallStackHelperLogSink); Info and Error
// mark taskSink's.
func (s *taskSink) GetCallStackHelper() func() { return s.logs.helper }

// withCallDepth is sink told of depth more frames between the caller and
// it, when it attributes lines to their caller.
func withCallDepth(sink logr.LogSink, depth int) logr.LogSink {
	if d, ok := sink.(logr.CallDepthLogSink); ok {
		return d.WithCallDepth(depth)
	}
	return sink
}
