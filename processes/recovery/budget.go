package recovery

import (
	"time"

	"github.com/shepherd-fleet/shepherd/bmdb"
)

// DefaultMachineBudget is Recovery's per-machine budget
// (-recovery_machine_budget): at most three resets of one machine within
// 24 hours; the claim that would take a fourth holds the machine for
// Recovery and records Escalated instead, for a human.
//
// Why three in a day: a healthy machine needs Recovery seldom (a hung
// kernel, a lost power feed), so one reset is routine and a second in the
// same day can still be bad luck. A third says that resetting does not fix
// what is wrong (a DIMM, a disk, an image whose agent dies after every
// boot), and every further reset only hides the fault from the people who
// can fix it while it interrupts whatever the machine runs. The day is
// long enough to cover a slow boot loop (each attempt waits for the
// verify timeout and a backoff) and a fault that recurs with a daily job,
// and short enough that a machine which failed once a month ago has its
// whole budget again.
var DefaultMachineBudget = bmdb.MachineBudget{N: 3, Window: 24 * time.Hour}
