package statuspage

import (
	"context"
	"time"
)

// rebootWindow is the window of the overview's reboot figures.
const rebootWindow = time.Hour

// rebootsView is the overview's "Reboots" section: how long the machines
// Recovery reset took to come back in the last hour (from their Recovered
// events), and how many resets are still waiting or overdue
// (machine_reset).
type rebootsView struct {
	Recovered     int
	Median, Worst string
	Waiting       int
	Overdue       int
}

// reboots reads the overview's reboot figures; nil (with fail called) when
// they cannot be read.
func (h *handler) reboots(ctx context.Context, fail func(error)) *rebootsView {
	s, err := h.db.RecoveryStats(ctx, rebootWindow)
	if err != nil {
		fail(err)
		return nil
	}
	v := &rebootsView{Recovered: s.Recovered, Waiting: s.Waiting, Overdue: s.Overdue, Median: "–", Worst: "–"}
	if s.Recovered > 0 {
		v.Median, v.Worst = coarse(s.Median), coarse(s.Worst)
	}
	return v
}
