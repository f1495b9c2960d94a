package controlloop_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/bmdb/bmdbtest"
	"github.com/shepherd-fleet/shepherd/controlloop"
)

// A task's context carries a logger with the keys operators search by
// (process, machine, provider_id, session): process code that logs through
// klog.FromContext names its machine without passing it, and the runner's
// line about a failure adds result and cause.
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
	}, funcr.Options{})

	p := newProcess(func(ctx context.Context, task *controlloop.Task) error {
		klog.FromContext(ctx).Info("hello from the process")
		return errors.New("the BMC said no")
	})
	r, err := controlloop.New(e.db, p, fastConfig(p, 1), controlloop.NewMetrics(e.reg))
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
		return find("hello from the process") != "" && find("work failed") != "", nil
	})
	for _, want := range []string{`"process":"test"`, `"machine":"`, `"provider_id":"` + provider + `"`, `"session":"`} {
		for _, msg := range []string{"hello from the process", "work failed"} {
			if l := find(msg); !strings.Contains(l, want) {
				t.Errorf("%q line lacks %s: %s", msg, want, l)
			}
		}
	}
	if l := find("work failed"); !strings.Contains(l, `"result":"failed"`) || !strings.Contains(l, `"cause":"the BMC said no"`) {
		t.Errorf("the failure's line lacks result or cause: %s", l)
	}
}
