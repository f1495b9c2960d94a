package controlloop

import (
	"testing"

	"github.com/google/uuid"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// A machine an operator asked to run now jumps the machines claimed
// ahead: the next worker takes it first. Once the claimer closed the
// queue, the workers still get every task left, forced first.
func TestTaskQueueForcedFirst(t *testing.T) {
	q := newTaskQueue(8)
	task := func(forced bool) *Task {
		return &Task{Machine: uuid.New(), work: &bmdb.Lease{Forced: forced}}
	}
	ordinary := []*Task{task(false), task(false), task(false)}
	for _, o := range ordinary {
		q.put(o)
	}
	forced := task(true)
	q.put(forced)
	if got, ok := q.next(); !ok || got != forced {
		t.Fatalf("next: %v, %t; want the forced task before the 3 queued ahead", got, ok)
	}
	if got, _ := q.next(); got != ordinary[0] {
		t.Fatalf("next: %v, want the first ordinary task", got)
	}
	late := task(true)
	q.put(late)
	q.close()
	want := []*Task{late, ordinary[1], ordinary[2]}
	for i, w := range want {
		if got, ok := q.next(); !ok || got != w {
			t.Fatalf("after close, task %d: %v, %t; want %v", i, got, ok, w)
		}
	}
	if got, ok := q.next(); ok {
		t.Fatalf("next on a closed, empty queue: %v, want none", got)
	}
}
