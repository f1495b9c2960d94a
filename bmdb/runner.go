package bmdb

import "time"

// Limits are a process's safety limits: the one type for them, which
// controlloop's Config carries (with flags -<p>_max_in_flight and the
// rest) and a claim enforces. They exist because a control loop that
// reboots machines is also a way to reboot the whole fleet: a bad agent
// build makes every heartbeat stop, and Recovery then sees every machine as
// needing a reboot. Each limit holds across every replica, because it is
// enforced through the BMDB, not in one replica's memory:
//
//   - MaxInFlight and MaxPerHour bound the leases the process holds at once
//     and takes per sliding hour. Claims of a process with either are
//     serialized by an advisory lock held for the claim's transaction, so
//     that replicas racing for the last free slot cannot both take it;
//   - MachineBudget bounds the leases of one machine within a window;
//   - the circuit breaker (BreakerWindow, BreakerThreshold) pauses the
//     process when more than BreakerThreshold of its last BreakerWindow
//     attempts failed. The pause is a row in the BMDB, so every replica
//     stops claiming, and it lasts until an operator resumes the process.
//
// The zero value of each limit disables it.
type Limits struct {
	// MaxInFlight bounds the leases the process holds at once, across
	// replicas; 0 = no bound.
	MaxInFlight int
	// MaxPerHour bounds the leases the process takes in any sliding hour
	// (counted from Started events in history), across replicas; 0 = no
	// bound.
	MaxPerHour int
	// BreakerWindow is the number of recent attempts (finished,
	// rescheduled or failed, across replicas, since the last resume) the
	// circuit breaker judges; 0 disables the breaker. It trips only on a
	// full window.
	BreakerWindow int
	// BreakerThreshold is the failure ratio of the window above which the
	// breaker trips, in [0, 1).
	BreakerThreshold float64
	// MachineBudget bounds the leases the process takes of one machine
	// within a window; unset = no bound. The claim that finds a
	// machine over it holds the machine for the process and records
	// Escalated instead of leasing it. It takes no lock: the claim judges
	// it per machine, under the machine's due-row lock.
	MachineBudget MachineBudget
	// ExpectedDuration is how long one lease should be held at most: not
	// enforced, but exported by the runner for the alert that compares it
	// with the age of the oldest lease; 0 = not stated.
	ExpectedDuration time.Duration
}

// SessionConfig describes a runner's BMDB session, whose heartbeats keep
// its leases alive (controlloop.Config.Session).
type SessionConfig struct {
	// Component names the owner in the sessions table (for operators), e.g.
	// "shepherd-agentstart".
	Component string
	// RuntimeInfo describes the owner (host, pid, version); defaulted.
	RuntimeInfo string
	// Interval is how long the session stays alive in the database without a
	// heartbeat. It is rounded up to whole seconds (at least 1 s); the owner
	// heartbeats every Interval/2. Default 10 s.
	Interval time.Duration
	// Margin is how much earlier than the database the owner gives up on its
	// session: the local deadline is the send time of the last successful
	// heartbeat + Interval - Margin. Default Interval/5.
	Margin time.Duration
	// ReapInterval, when set, makes this session also reap expired sessions
	// (of any replica) on a timer of its own, every ReapInterval. By default
	// (0) it reaps only when one of its heartbeats, every Interval/2, finds
	// an expired session: an idle replica then spends no transaction on
	// reaping, and a dead session's leases wait at most Interval/2 after
	// its expiry for a reaper.
	ReapInterval time.Duration
}
