package controlloop_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/internal/bmdb"
	"github.com/shepherd-fleet/shepherd/internal/bmdbtest"
)

// A task's context carries a logger with the keys operators search by
// (process, machine, provider_id, session): process code that logs through
// klog.FromContext names its machine without passing it, and the runner's
// line about a failure adds result and cause. Each line names the file
// that wrote it (the task's logger adds its keys lazily, through a sink of
// its own, which must not shift the caller a sink reports).
func TestTaskContextLogger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.addMachines(1)
	var provider string
	if err := e.db.Transact(t.Context(), func(ctx context.Context, tx *bmdb.Tx) error {
		return tx.QueryRow(ctx, `SELECT provider_id FROM machine_provided`).Scan(&provider)
	}); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var lines []string
	logger := funcr.NewJSON(func(obj string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, obj)
	}, funcr.Options{LogCaller: funcr.All})

	var helperCalledAt int
	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		klog.FromContext(ctx).Info("hello from the process")
		klog.FromContext(ctx).WithValues("step", "derived").Info("a derived logger's line")
		helperCalledAt = logThroughHelper(klog.FromContext(ctx))
		return errors.New("the BMC said no")
	})
	r, err := e.newRunner(p, fastConfig(p, 1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	find := func(msg string) string {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, `"msg":"`+msg+`"`) {
				return l
			}
		}
		return ""
	}
	bmdbtest.WaitForNoError(t, 10*time.Second, "the process's and the runner's lines", func() (bool, error) {
		return find("hello from the process") != "" && find("Work failed") != "", nil
	})
	for _, want := range []string{`"process":"test"`, `"machine":"`, `"provider_id":"` + provider + `"`, `"session":"`} {
		for _, msg := range []string{"hello from the process", "a derived logger's line", "Work failed"} {
			if l := find(msg); !strings.Contains(l, want) {
				t.Errorf("%q line lacks %s: %s", msg, want, l)
			}
		}
	}
	if l := find("Work failed"); !strings.Contains(l, `"result":"failed"`) || !strings.Contains(l, `"cause":"the BMC said no"`) {
		t.Errorf("the failure's line lacks result or cause: %s", l)
	}
	for msg, file := range map[string]string{"hello from the process": "logging_test.go", "a derived logger's line": "logging_test.go", "Work failed": "runner.go"} {
		if l := find(msg); !strings.Contains(l, `"caller":{"file":"`+file+`"`) {
			t.Errorf("%q line is not attributed to %s: %s", msg, file, l)
		}
	}
	want := fmt.Sprintf(`"caller":{"file":"logging_test.go","line":%d}`, helperCalledAt)
	if l := find("through a helper"); !strings.Contains(l, want) {
		t.Errorf("a helper's line (WithCallDepth(1)) is not attributed to its caller (%s): %s", want, l)
	}
}

// logThroughHelper logs as a process's logging helper does, attributing
// the line to its caller, and returns the caller's line.
func logThroughHelper(logger klog.Logger) int {
	logger.WithCallDepth(1).Info("through a helper")
	_, _, line, _ := runtime.Caller(1)
	return line
}

// The runner and the BMDB log through the logger of the context they are
// given (klog.NewContext), never klog's globals: an embedding program
// routes their lines by the context it passes, and a test sees its own
// lines in its own output. The lines come from the runner (start, session,
// a failed task), from a session's heartbeat goroutine, which outlives the
// context that started it (a dead session's loss, and its reaping by the
// runner's session) and from the DB's statement probe.
func TestRunnerAndBMDBLogThroughTheContext(t *testing.T) {
	t.Parallel()
	// The test's output, and a copy to look at.
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer()
	e := newEnv(t)
	e.addMachines(1)

	// A replica that died: its session is lost at once, and expires in
	// the database a second later for the runner's session to reap.
	dead, err := e.db.StartSession(ctx, bmdb.SessionConfig{Component: "dead", Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dead.Abandon()

	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		return errors.New("the BMC said no")
	})
	cfg := fastConfig(p, 1)
	// Pokes every second, each one a chance to find the dead session.
	cfg.Session.Interval = 2 * time.Second
	r, err := e.newRunner(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Each line is one of its alternatives.
	want := [][]string{
		{"Starting workers"},     // controlloop: Run
		{"Holding BMDB session"}, // controlloop: currentSession
		{"Work failed"},          // controlloop: the task's logger
		{ // bmdb: the DB's statement probe, by the session that ran it
			"BMDB: no transaction pooler; connections prepare their statements",
			"BMDB: a transaction-mode pooler; statements are sent unnamed, parsed and planned at every execution",
		},
		{"BMDB session lost: cancelling all work under it"}, // bmdb: the dead session
		{"Reaped expired BMDB sessions"},                    // bmdb: the runner's session's heartbeat
	}
	missing := func() [][]string {
		seen := map[string]bool{}
		for _, entry := range logs.Data() {
			seen[entry.Message] = true
		}
		var out [][]string
		for _, alternatives := range want {
			if !slices.ContainsFunc(alternatives, func(msg string) bool { return seen[msg] }) {
				out = append(out, alternatives)
			}
		}
		return out
	}
	bmdbtest.WaitFor(t, time.Minute, "the runner's and the BMDB's lines in the test's logger", func() (bool, string) {
		m := missing()
		return len(m) == 0, fmt.Sprintf("missing %q", m)
	})
}
