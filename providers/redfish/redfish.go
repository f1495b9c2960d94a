// Package redfish reboots machines through their BMC's Redfish API, with
// github.com/stmcginnis/gofish: it finds the machine's ComputerSystem and
// posts its Reset action (ForceRestart unless the inventory says otherwise).
//
// Authentication is HTTP Basic, which the Redfish specification requires
// every service to support: it is stateless, so an interrupted reboot never
// leaves a session behind on a BMC with few session slots. Credentials come
// from a file named by the inventory (see ReadCredentials), read afresh for
// every reboot so that rotating them needs no restart; they never appear in
// flags, logs or errors. TLS is verified against the system roots or a CA
// file given per machine; there is no option to skip verification.
package redfish

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"
)

// DefaultResetType is the reset a reboot asks for when the inventory names
// none: immediate, whatever state the operating system is in, which is what
// a machine whose agent stopped heartbeating usually needs.
const DefaultResetType = "ForceRestart"

// ResetTypes are the Redfish ResetType values that reboot a machine, and
// hence the ones an inventory may configure. (On, ForceOff and the like
// would leave a machine off.)
var ResetTypes = []string{"ForceRestart", "GracefulRestart", "PowerCycle", "FullPowerCycle"}

// Config is the Redfish client's configuration, shared by all machines.
type Config struct {
	// Timeout bounds one reboot: connecting, finding the system, posting
	// the reset.
	Timeout time.Duration
}

// DefaultConfig returns the configuration before flags.
func DefaultConfig() Config {
	return Config{Timeout: 30 * time.Second}
}

// RegisterFlags registers -redfish_timeout on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Timeout, "redfish_timeout", c.Timeout, "bound on one reboot through a BMC's Redfish API (connect, find the system, reset)")
}

// Check validates the configuration; its errors name the flag.
func (c *Config) Check() error {
	if c.Timeout <= 0 {
		return fmt.Errorf("-redfish_timeout %s: must be positive", c.Timeout)
	}
	return nil
}

// Target is one machine's BMC, as the inventory describes it.
type Target struct {
	// Endpoint is the BMC's base URL, scheme and host only, e.g.
	// https://10.0.100.12 (the client adds /redfish/v1).
	Endpoint string
	// CredentialsFile names the file holding the BMC account (see
	// ReadCredentials).
	CredentialsFile string
	// SystemID selects the ComputerSystem by its Id or @odata.id; empty
	// means the only system the BMC manages.
	SystemID string
	// ResetType is one of ResetTypes; empty means DefaultResetType.
	ResetType string
	// CAFile, if set, names a PEM file of certificates to verify the BMC's
	// TLS certificate with, instead of the system roots.
	CAFile string
	// AllowHTTP lets an http:// Endpoint be used. Without it such an
	// endpoint is refused, since HTTP Basic would send the BMC's password
	// in cleartext; an operator sets it (inventory: redfish.allow_http)
	// for a BMC on a network they trust that has no TLS.
	AllowHTTP bool
}

// ParseEndpoint checks a BMC base URL and returns it in canonical form
// (scheme://host[:port]). It refuses user information in the URL, since
// credentials belong in a file, and its errors never quote the URL, which
// might hold one.
func ParseEndpoint(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("not a URL")
	}
	switch {
	case u.User != nil:
		return "", errors.New("credentials in the URL are refused: put them in credentials_file")
	case u.Scheme != "https" && u.Scheme != "http":
		return "", errors.New("want an http or https URL, e.g. https://10.0.100.12")
	case u.Host == "" || u.Hostname() == "":
		return "", errors.New("the URL has no host")
	case u.Path != "" && u.Path != "/":
		return "", errors.New("want the BMC's base URL without a path (the client adds /redfish/v1)")
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return "", errors.New("the URL must not have a query or fragment")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", errors.New("the URL's port is not a number between 1 and 65535")
		}
	}
	return u.Scheme + "://" + u.Host, nil
}

// ErrCleartext refuses an http:// endpoint not explicitly allowed.
var ErrCleartext = errors.New("http:// would send the BMC's password in cleartext: use https://, or set redfish.allow_http: true for this machine")

// ValidResetType reports whether t is one of ResetTypes.
func ValidResetType(t string) bool { return slices.Contains(ResetTypes, t) }

// LoadCAFile reads a PEM file of certificates into a pool.
func LoadCAFile(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// Client reboots machines through Redfish. It is safe for concurrent use.
type Client struct {
	cfg Config
}

// New returns a client with cfg.
func New(cfg Config) *Client { return &Client{cfg: cfg} }

// Reset resets the machine behind t with its configured reset type. It
// returns once the BMC accepted the reset, not when the machine is back.
func (c *Client) Reset(ctx context.Context, t Target) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	endpoint, err := ParseEndpoint(t.Endpoint)
	if err != nil {
		return fmt.Errorf("redfish endpoint: %w", err)
	}
	if strings.HasPrefix(endpoint, "http://") && !t.AllowHTTP {
		return fmt.Errorf("redfish endpoint %s: %w", endpoint, ErrCleartext)
	}
	resetType := t.ResetType
	if resetType == "" {
		resetType = DefaultResetType
	}
	if !ValidResetType(resetType) {
		return fmt.Errorf("redfish reset type %q: want one of %s", resetType, strings.Join(ResetTypes, ", "))
	}
	creds, err := ReadCredentials(t.CredentialsFile)
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		if tlsConfig.RootCAs, err = LoadCAFile(t.CAFile); err != nil {
			return fmt.Errorf("redfish: %w", err)
		}
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: c.cfg.Timeout,
		DisableKeepAlives:   true,
	}
	defer transport.CloseIdleConnections()

	api, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:  endpoint,
		Username:  creds.Username,
		Password:  creds.Password,
		BasicAuth: true,
		// ctx bounds the whole reset; the client's own timeout, a little
		// longer, only backs it up for calls that do not carry ctx, so that
		// an expired reset reports the deadline, not a transport timeout.
		HTTPClient: &http.Client{Transport: boundedTransport{transport}, Timeout: c.cfg.Timeout + time.Second, CheckRedirect: checkRedirect},
	})
	if err != nil {
		return fmt.Errorf("connecting to Redfish service at %s: %w", endpoint, contextError(ctx, err))
	}
	systems, err := api.Service.Systems()
	if err != nil {
		return fmt.Errorf("listing systems of %s: %w", endpoint, contextError(ctx, err))
	}
	system, err := pickSystem(systems, t.SystemID)
	if err != nil {
		//lint:ignore ST1005 Redfish is a proper noun.
		return fmt.Errorf("Redfish service at %s: %w", endpoint, err)
	}
	// A BMC that answers 202 hands back a task monitor; the reset is
	// then under way, which is all Reset promises.
	if _, err := system.Reset(schemas.ResetType(resetType)); err != nil {
		return fmt.Errorf("resetting system %s at %s (%s): %w", system.ID, endpoint, resetType, contextError(ctx, err))
	}
	return nil
}

// pickSystem selects the system with id (its Id, @odata.id or the last
// element of the latter), or the only one when id is empty.
func pickSystem(systems []*schemas.ComputerSystem, id string) (*schemas.ComputerSystem, error) {
	var ids []string
	for _, s := range systems {
		if id != "" && (s.ID == id || s.ODataID == id || path.Base(strings.TrimSuffix(s.ODataID, "/")) == id) {
			return s, nil
		}
		ids = append(ids, s.ID)
	}
	switch {
	case len(systems) == 0:
		return nil, errors.New("it manages no system")
	case id != "":
		return nil, fmt.Errorf("no system %q (systems: %s)", id, strings.Join(ids, ", "))
	case len(systems) > 1:
		return nil, fmt.Errorf("it manages %d systems (%s): set redfish.system_id in the inventory", len(systems), strings.Join(ids, ", "))
	}
	return systems[0], nil
}

// contextError prefers the context's error, which says "deadline exceeded"
// plainly, over the transport's rendering of it.
func contextError(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}
