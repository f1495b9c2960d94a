// Package ipmi power-cycles machines through their BMC over IPMI 2.0
// (RMCP+, "lanplus"), for BMCs without a usable Redfish API, with the pure
// Go client github.com/bougou/go-ipmi (no ipmitool process).
//
// Every action opens one short session and closes it: a BMC drops idle
// sessions after about 30 s and has few of them, so a session kept open
// between reboots would mostly be a dead one. One cipher suite is asked
// for (3 by default: HMAC-SHA1, AES-CBC-128, which every IPMI 2.0 BMC
// offers): walking the library's list would cost seconds per action, and
// with a wrong password one failed login per suite, enough to lock the
// account on a real BMC. Credentials come from a file, as for Redfish.
package ipmi

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/providers/bmccred"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Method names IPMI in metrics and causes, beside redfish and ssh.
const Method = "ipmi"

// DefaultPort is IPMI's RMCP port.
const DefaultPort = 623

// DefaultCipherSuite is the cipher suite asked for unless the inventory
// names another.
const DefaultCipherSuite = 3

// Reset types: power_cycle (off, then on: what a hung machine needs) and
// hard_reset (a reset line pulse, for BMCs whose power cycle is slow).
const (
	ResetPowerCycle = "power_cycle"
	ResetHard       = "hard_reset"
)

// ResetTypes are the reset types an inventory may configure.
var ResetTypes = []string{ResetPowerCycle, ResetHard}

// Privileges are the session privilege levels an inventory may ask for;
// chassis control needs operator at least.
var Privileges = []string{"operator", "administrator"}

// Config is the IPMI client's configuration, shared by all machines.
type Config struct {
	// Timeout bounds one action: login, command, logout.
	Timeout time.Duration
}

// DefaultConfig returns the configuration before flags.
func DefaultConfig() Config { return Config{Timeout: 10 * time.Second} }

// RegisterFlags registers -ipmi_timeout on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Timeout, "ipmi_timeout", c.Timeout, "bound on one power action through a BMC's IPMI (login, command, logout)")
}

// Check validates the configuration; its errors name the flag.
func (c *Config) Check() error {
	if c.Timeout <= 0 || c.Timeout > 10*time.Minute {
		return fmt.Errorf("-ipmi_timeout %s: must be above 0 and at most 10m", c.Timeout)
	}
	return nil
}

// Target is one machine's BMC, as the inventory describes it.
type Target struct {
	// Address is the BMC's host name or IP address.
	Address string
	// Port is its RMCP port (DefaultPort when 0).
	Port int
	// CredentialsFile names the file holding the BMC account, user:password
	// (or the JSON form; see bmccred.Read).
	CredentialsFile string
	// CipherSuite is the RMCP+ cipher suite (DefaultCipherSuite when 0).
	CipherSuite int
	// Privilege is one of Privileges ("administrator" when empty).
	Privilege string
	// ResetType is one of ResetTypes (ResetPowerCycle when empty).
	ResetType string
}

// Endpoint is the BMC's address as causes and logs show it.
func (t Target) Endpoint() string {
	port := t.Port
	if port == 0 {
		port = DefaultPort
	}
	return net.JoinHostPort(t.Address, strconv.Itoa(port))
}

// ValidCipherSuite reports whether n is an RMCP+ cipher suite the client
// can use (IPMI 2.0 table 22-20, and 17, the SHA-256 suite).
func ValidCipherSuite(n int) bool { return n >= 0 && n <= 17 }

// Client power-cycles machines over IPMI. It is safe for concurrent use.
type Client struct {
	cfg Config
	// unguarded turns the packet guard off (guard.go), for tests that
	// reach the library's panics.
	unguarded bool
}

// New returns a client with cfg.
func New(cfg Config) *Client { return &Client{cfg: cfg} }

// Reset power-cycles (or resets) the machine behind t. It returns once the
// BMC accepted the command. A BMC that does not answer costs at most the
// configured timeout (or ctx's deadline, if sooner).
func (c *Client) Reset(ctx context.Context, t Target) error {
	control, err := resetControl(t.ResetType)
	if err != nil {
		return err
	}
	return c.do(ctx, t, "resetting ("+resetName(t.ResetType)+")", func(ctx context.Context, cl *client.Client) error {
		_, err := cl.ChassisControl(ctx, control)
		return err
	})
}

// PowerOn powers the machine behind t on (chassis control "power up"):
// what a machine that is off needs, since most BMCs ignore a power cycle
// of a chassis that is off and still answer that they did it. It returns
// once the BMC accepted the command.
func (c *Client) PowerOn(ctx context.Context, t Target) error {
	return c.do(ctx, t, "powering on", func(ctx context.Context, cl *client.Client) error {
		_, err := cl.ChassisControl(ctx, chassis.ChassisControlPowerUp)
		return err
	})
}

// Recover brings the machine behind t back in one session (one login):
// it reads the chassis status and powers the chassis up if it is off, or
// resets it as configured if it is on. Reading first matters because most
// BMCs ignore a power cycle of a chassis that is off, and still answer
// that they did it. read reports whether the status was read (when it is
// false nothing was done, and err says why); wasOn what it said. It
// returns once the BMC accepted the command.
func (c *Client) Recover(ctx context.Context, t Target) (read, wasOn bool, err error) {
	control, err := resetControl(t.ResetType)
	if err != nil {
		return false, false, err
	}
	err = c.do(ctx, t, "resetting ("+resetName(t.ResetType)+")", func(ctx context.Context, cl *client.Client) error {
		st, err := cl.GetChassisStatus(ctx)
		if err != nil {
			return fmt.Errorf("reading the chassis status: %w", err)
		}
		read, wasOn = true, st.PowerIsOn
		if !wasOn {
			control = chassis.ChassisControlPowerUp
		}
		_, err = cl.ChassisControl(ctx, control)
		return err
	})
	return read, wasOn, err
}

// PowerStatus reports whether the machine behind t is powered on, from
// the BMC's chassis status.
func (c *Client) PowerStatus(ctx context.Context, t Target) (on bool, err error) {
	err = c.do(ctx, t, "reading power status", func(ctx context.Context, cl *client.Client) error {
		st, err := cl.GetChassisStatus(ctx)
		if err == nil {
			on = st.PowerIsOn
		}
		return err
	})
	return on, err
}

// resetControl is the chassis control that resets a machine the way
// resetType (Target.ResetType) names.
func resetControl(resetType string) (chassis.ChassisControl, error) {
	switch resetType {
	case "", ResetPowerCycle:
		return chassis.ChassisControlPowerCycle, nil
	case ResetHard:
		return chassis.ChassisControlHardReset, nil
	default:
		return 0, bmcerr.New(bmcerr.Configuration, fmt.Errorf("ipmi reset type %q: want one of %s", resetType, strings.Join(ResetTypes, ", ")))
	}
}

func resetName(t string) string {
	if t == "" {
		return ResetPowerCycle
	}
	return t
}

// do runs action in a session of its own with t's BMC, bounded by the
// configured timeout; errors name the method and the BMC, with the BMC's
// text cleaned and bounded, and carry their class (see classOf).
func (c *Client) do(ctx context.Context, t Target, what string, action func(context.Context, *client.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	fail := func(err error) error {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		// The class is read from the library's error before its text,
		// which is the BMC's in part, is cleaned into the cause.
		return bmcerr.New(classOf(err), fmt.Errorf("ipmi %s at %s: %s", what, t.Endpoint(), untrusted.Line(err.Error(), 0)))
	}
	creds, err := bmccred.Read(t.CredentialsFile)
	if err != nil {
		return bmcerr.New(bmcerr.Configuration, fmt.Errorf("ipmi at %s: %w", t.Endpoint(), err))
	}
	suite := t.CipherSuite
	if suite == 0 {
		suite = DefaultCipherSuite
	}
	privilege := types.PrivilegeLevelAdministrator
	if t.Privilege == "operator" {
		privilege = types.PrivilegeLevelOperator
	}
	port := t.Port
	if port == 0 {
		port = DefaultPort
	}
	guard, err := newGuard(types.CipherSuiteID(suite), creds.Password)
	if err != nil {
		return fail(err)
	}
	dialer := &guardDialer{ctx: ctx, endpoint: t.Endpoint(), g: guard, unchecked: c.unguarded}
	cl, err := client.NewClient(t.Address, port, creds.Username, creds.Password)
	if err != nil {
		return fail(err)
	}
	deadline, _ := ctx.Deadline()
	cl.WithInterface(client.InterfaceLanplus).
		WithCipherSuiteID(types.CipherSuiteID(suite)).
		WithMaxPrivilegeLevel(privilege).
		WithTimeout(max(time.Until(deadline), time.Millisecond)).
		WithRetry(0).
		WithUDPProxy(dialer)

	// The library is given ctx; the select makes sure a call that does not
	// honour it still costs no more than its deadline.
	done := make(chan error, 1)
	go func() {
		// Whatever the library does, its socket is closed when the
		// session ends: it leaves it open when a login fails.
		defer dialer.close()
		done <- c.session(ctx, t, cl, action)
	}()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		if refused := guard.firstRefused(); refused != nil {
			// The library wraps the refusal in its own words (and
			// sometimes with %v, losing it); the cause says what the
			// BMC sent.
			err = fmt.Errorf("%s: %w", stage(err), refused)
		}
		return fail(err)
	case <-ctx.Done():
		return fail(ctx.Err())
	}
}

// sessionBound bounds the command after login. The library starts, at
// login, a keepalive goroutine of its own that sends a command every 30 s
// until the session is closed; a panic in it (on a reply it cannot parse)
// would be out of any recover's reach. A session closed within this bound
// never lets it run. One chassis command needs a fraction of it.
const sessionBound = 20 * time.Second

// session logs in, runs action and logs out. Every call into the library
// is made under recoverLibrary: bytes from the BMC that the library cannot
// parse (past the guard) fail this action, and only it.
func (c *Client) session(ctx context.Context, t Target, cl *client.Client, action func(context.Context, *client.Client) error) (err error) {
	defer recoverLibrary(ctx, t, "logging in", &err)
	if err := cl.Connect(ctx); err != nil {
		return fmt.Errorf("logging in: %w", err)
	}
	// The library's Close panics when called twice: it is called once,
	// here, and its failure (or panic) does not undo an action the BMC
	// accepted.
	defer func() {
		var closeErr error
		defer recoverLibrary(ctx, t, "logging out", &closeErr)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		closeErr = cl.Close(closeCtx)
	}()
	actionCtx, cancel := context.WithTimeout(ctx, sessionBound)
	defer cancel()
	defer recoverLibrary(ctx, t, "after login", &err)
	return action(actionCtx, cl)
}

// recoverLibrary turns a panic of the IPMI library into *err, a bounded
// cause without a stack (the stack is logged at -v=2), so that no byte from
// a BMC can end the process or more than the one action. It logs to ctx's
// logger.
func recoverLibrary(ctx context.Context, t Target, when string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	text := untrusted.Line(fmt.Sprint(r), maxPanicText)
	logger := klog.FromContext(ctx)
	logger.Error(nil, "IPMI library panicked on a BMC's reply; the action fails", "bmc", t.Endpoint(), "when", when, "panic", text)
	logger.V(2).Info("IPMI library panic stack", "bmc", t.Endpoint(), "stack", string(debug.Stack()))
	*err = fmt.Errorf("%s: %w: %s", when, errLibraryFailed, text)
}

// maxPanicText bounds the panic's text in a cause.
const maxPanicText = 200

// stage names the part of the session a library error came from, to keep
// in a cause that names the refused packet instead of the library's words.
func stage(err error) string {
	if strings.HasPrefix(err.Error(), "logging in") {
		return "logging in"
	}
	return "after login"
}

// ValidResetType reports whether s is one of ResetTypes.
func ValidResetType(s string) bool { return slices.Contains(ResetTypes, s) }

// ValidPrivilege reports whether s is one of Privileges.
func ValidPrivilege(s string) bool { return slices.Contains(Privileges, s) }
