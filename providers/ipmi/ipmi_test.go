package ipmi

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/ipmisimtest"
)

func simTarget(t *testing.T, sim *ipmisimtest.Sim, pass string) Target {
	return Target{Address: sim.Host, Port: sim.Port, CredentialsFile: sim.WriteCredentials(t, t.TempDir(), pass)}
}

// startSim starts a BMC (ipmi_sim) and returns it with a client of the
// default configuration and the target that reaches it.
func startSim(t *testing.T) (*ipmisimtest.Sim, *Client, Target) {
	t.Helper()
	sim := ipmisimtest.Start(t)
	return sim, New(DefaultConfig()), simTarget(t, sim, "")
}

// A power cycle through a real IPMI BMC (ipmi_sim), seen on its side: the
// chassis powers off and on again.
func TestPowerCycleSeenByTheBMC(t *testing.T) {
	t.Parallel()
	sim, c, target := startSim(t)
	ctx := context.Background()
	if on, err := c.PowerStatus(ctx, target); err != nil || !on {
		t.Fatalf("PowerStatus = %v, %v; want on", on, err)
	}
	before := sim.PowerOns(t)
	if err := c.Reset(ctx, target); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	// The simulator counts the power-on before it logs it: wait for both.
	for sim.PowerOns(t) == before || !strings.Contains(sim.Log(t), "power 1") {
		if time.Now().After(deadline) {
			t.Fatalf("the BMC did not power the chassis on again; its log:\n%s", sim.Log(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if log := sim.Log(t); !strings.Contains(log, "power 0") || !strings.Contains(log, "power 1") {
		t.Errorf("the BMC's log does not show the power cycle:\n%s", log)
	}
}

// A wrong password fails at once, with one login (one cipher suite), and
// the error names the method and the BMC, not the password.
func TestWrongPassword(t *testing.T) {
	t.Parallel()
	sim := ipmisimtest.Start(t)
	start := time.Now()
	err := New(DefaultConfig()).Reset(context.Background(), simTarget(t, sim, "not-the-password"))
	if err == nil {
		t.Fatal("Reset with a wrong password succeeded")
	}
	if !strings.Contains(err.Error(), "ipmi") || !strings.Contains(err.Error(), sim.Host) || strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("error %q: want the method and the BMC's address, and no password", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a wrong password took %s to fail", d)
	}
	if sim.PowerOns(t) != 0 || strings.Contains(sim.Log(t), "power 0") {
		t.Error("the chassis was power cycled with a wrong password")
	}
}

// A BMC that does not answer (a UDP socket that never replies, or a hung
// ipmi_sim) costs at most the timeout plus a second.
func TestUnansweringBMCBounded(t *testing.T) {
	t.Parallel()
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	sim := ipmisimtest.Start(t)
	hung := simTarget(t, sim, "")
	sim.Freeze(t)
	defer sim.Thaw(t)
	addr := silent.LocalAddr().(*net.UDPAddr)
	c := New(Config{Timeout: 2 * time.Second})
	for name, target := range map[string]Target{
		"silent socket": {Address: "127.0.0.1", Port: addr.Port, CredentialsFile: hung.CredentialsFile},
		"frozen BMC":    hung,
	} {
		start := time.Now()
		err := c.Reset(context.Background(), target)
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "deadline") {
			t.Errorf("%s: %v, want a deadline error", name, err)
		}
		if took > 3*time.Second {
			t.Errorf("%s: took %s with a 2 s timeout", name, took)
		}
	}
}

// A BMC killed in the middle of a session (while the client waits for its
// answer) fails the action within the timeout plus a second, cleanly.
func TestBMCKilledMidSession(t *testing.T) {
	t.Parallel()
	sim := ipmisimtest.Start(t)
	target := simTarget(t, sim, "")
	sim.Freeze(t) // the request waits, unanswered
	c := New(Config{Timeout: 3 * time.Second})
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Reset(context.Background(), target) }()
	time.Sleep(500 * time.Millisecond) // the scenario: the BMC dies half a second in
	sim.Kill(t)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "ipmi") || !strings.Contains(err.Error(), sim.Host) {
			t.Errorf("Reset against a BMC killed mid-session: %v, want an ipmi error naming the BMC", err)
		}
		if took := time.Since(start); took > 4*time.Second {
			t.Errorf("took %s with a 3 s timeout", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Reset did not return 10 s after the BMC died")
	}
}

// A chassis that is off (a tripped PSU) reads as off, and PowerOn powers it
// on: the BMC is asked for "power 1" and never for "power 0", a power on
// and not a cycle.
func TestPowerOnAChassisThatIsOff(t *testing.T) {
	t.Parallel()
	sim, c, target := startSim(t)
	ctx := context.Background()
	sim.SetPower(t, false)
	if on, err := c.PowerStatus(ctx, target); err != nil || on {
		t.Fatalf("PowerStatus of a chassis that is off = %v, %v; want off", on, err)
	}
	if err := c.PowerOn(ctx, target); err != nil {
		t.Fatalf("PowerOn: %v", err)
	}
	if on, err := c.PowerStatus(ctx, target); err != nil || !on {
		t.Fatalf("PowerStatus after PowerOn = %v, %v; want on", on, err)
	}
	log := sim.Log(t)
	if !strings.Contains(log, "power 1") || strings.Contains(log, "power 0") {
		t.Errorf("the BMC's log shows no power on, or a power off:\n%s", log)
	}
}

// Recover reads the chassis and acts in one session: a chassis that is off
// is powered up (no "power 0" in the BMC's log), one that is on is power
// cycled.
func TestRecoverReadsThenActs(t *testing.T) {
	t.Parallel()
	sim, c, target := startSim(t)
	ctx := context.Background()
	sim.SetPower(t, false)
	if read, on, err := c.Recover(ctx, target); err != nil || !read || on {
		t.Fatalf("Recover of a chassis that is off = read %v, on %v, %v; want read, off", read, on, err)
	}
	if log := sim.Log(t); !strings.Contains(log, "power 1") || strings.Contains(log, "power 0") {
		t.Fatalf("the BMC's log shows no power on, or a power off:\n%s", log)
	}
	if read, on, err := c.Recover(ctx, target); err != nil || !read || !on {
		t.Fatalf("Recover of a chassis that is on = read %v, on %v, %v; want read, on", read, on, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(sim.Log(t), "power 0") {
		if time.Now().After(deadline) {
			t.Fatalf("the chassis that was on was not power cycled; the BMC's log:\n%s", sim.Log(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A wrong password: nothing read, nothing done.
	bad := simTarget(t, sim, "not-the-password")
	if read, _, err := c.Recover(ctx, bad); err == nil || read {
		t.Errorf("Recover with a wrong password = read %v, %v; want an error and nothing read", read, err)
	}
}
