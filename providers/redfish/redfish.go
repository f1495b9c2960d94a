// Package redfish reboots machines through their BMC's Redfish API, with
// github.com/stmcginnis/gofish: it finds the machine's ComputerSystem and
// posts its Reset action (ForceRestart unless the inventory says otherwise).
//
// Authentication is HTTP Basic, which the Redfish specification requires
// every service to support: it is stateless, so an interrupted reboot never
// leaves a session behind on a BMC with few session slots. Credentials come
// from a file named by the inventory (package bmccred), read afresh for
// every reboot so that rotating them needs no restart; they never appear in
// flags, logs or errors. TLS is verified against the system roots or a CA
// file given per machine; there is no option to skip verification.
//
// A BMC's answers are untrusted: each reset's conversation with the BMC is
// bounded in requests and bytes, and sends requests, which carry the
// credentials, to the inventory's endpoint only, whatever links the BMC
// hands out (see conversation).
package redfish

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/providers/bmccred"
	"github.com/shepherd-fleet/shepherd/providers/bmcerr"
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
	// bmccred.Read).
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
	resetType := t.ResetType
	if resetType == "" {
		resetType = DefaultResetType
	}
	if !ValidResetType(resetType) {
		return fmt.Errorf("redfish reset type %q: want one of %s", resetType, strings.Join(ResetTypes, ", "))
	}
	return c.reset(ctx, t, resetType)
}

// PowerOn powers the machine behind t on (ResetType On): what a machine
// that is off needs, since a restart of a system that is off does nothing
// on many BMCs. It returns once the BMC accepted the action.
func (c *Client) PowerOn(ctx context.Context, t Target) error {
	return c.reset(ctx, t, string(schemas.OnResetType))
}

// Power states of a ComputerSystem that PowerState reports as on or off;
// the others (PoweringOn, PoweringOff, Paused, a missing or unknown value)
// are neither.
const (
	PowerStateOn  = "On"
	PowerStateOff = "Off"
)

// PowerState reads the PowerState of the system behind t, as the BMC
// reports it ("On", "Off", "PoweringOn", ...; "" when it reports none).
func (c *Client) PowerState(ctx context.Context, t Target) (string, error) {
	var state string
	err := c.withSystem(ctx, t, func(system *schemas.ComputerSystem, _ string, _ *conversation) error {
		state = string(system.PowerState)
		return nil
	})
	return state, err
}

// reset posts the system's Reset action with resetType.
func (c *Client) reset(ctx context.Context, t Target, resetType string) error {
	return c.withSystem(ctx, t, func(system *schemas.ComputerSystem, endpoint string, conv *conversation) error {
		// A BMC that answers 202 hands back a task monitor; the reset is
		// then under way, which is all Reset promises.
		if refused, err := checkOffered(system, resetType); err != nil {
			err = fmt.Errorf("resetting system %s at %s: %w", short(system.ID), endpoint, conv.cause(ctx, err))
			if refused {
				return bmcerr.New(bmcerr.Configuration, err)
			}
			return classify(err)
		}
		if _, err := system.Reset(schemas.ResetType(resetType)); err != nil {
			return classify(fmt.Errorf("resetting system %s at %s (%s): %w", short(system.ID), endpoint, resetType, conv.cause(ctx, err)))
		}
		return nil
	})
}

// withSystem finds the system behind t in one conversation with its BMC,
// bounded by the configured timeout, and runs action on it within the
// same conversation (and so the same bounds).
func (c *Client) withSystem(ctx context.Context, t Target, action func(system *schemas.ComputerSystem, endpoint string, conv *conversation) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	endpoint, creds, tlsConfig, err := prepare(t)
	if err != nil {
		// The inventory or a file it names cannot be used as it is.
		return bmcerr.New(bmcerr.Configuration, err)
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: c.cfg.Timeout,
		DisableKeepAlives:   true,
	}
	defer transport.CloseIdleConnections()
	endpointURL, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("redfish endpoint: %w", err)
	}
	conv := newConversation(transport, endpointURL)
	logger := klog.FromContext(ctx)

	api, err := gofish.ConnectContext(ctx, gofish.ClientConfig{
		Endpoint:  endpoint,
		Username:  creds.Username,
		Password:  creds.Password,
		BasicAuth: true,
		// ctx bounds the whole action; the client's own timeout, a little
		// longer, only backs it up for calls that do not carry ctx, so that
		// an expired action reports the deadline, not a transport timeout.
		HTTPClient: &http.Client{Transport: conv, Timeout: c.cfg.Timeout + time.Second, CheckRedirect: conv.checkRedirect},
	})
	if err != nil {
		return classify(fmt.Errorf("connecting to Redfish service at %s: %w", endpoint, conv.cause(ctx, err)))
	}
	system, err := findSystem(api, conv, t.SystemID)
	if err != nil {
		//lint:ignore ST1005 Redfish is a proper noun.
		return classify(fmt.Errorf("Redfish service at %s: %w", endpoint, conv.cause(ctx, err)))
	}
	if t.SystemID != "" && system.ID != t.SystemID {
		// Found by Name, or where the BMC redirected: the Id is what the
		// BMC's own pages and logs call the system.
		logger.V(1).Info("Redfish system_id resolved", "endpoint", endpoint, "system_id", t.SystemID, "id", short(system.ID))
	}
	return action(system, endpoint, conv)
}

// prepare checks t's endpoint and reads the files it names: the
// credentials and the CA.
func prepare(t Target) (endpoint string, creds bmccred.Credentials, tlsConfig *tls.Config, err error) {
	endpoint, err = ParseEndpoint(t.Endpoint)
	if err != nil {
		return "", creds, nil, fmt.Errorf("redfish endpoint: %w", err)
	}
	if strings.HasPrefix(endpoint, "http://") && !t.AllowHTTP {
		return "", creds, nil, fmt.Errorf("redfish endpoint %s: %w", endpoint, ErrCleartext)
	}
	if creds, err = bmccred.Read(t.CredentialsFile); err != nil {
		return "", creds, nil, err
	}
	tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		if tlsConfig.RootCAs, err = LoadCAFile(t.CAFile); err != nil {
			return "", creds, nil, fmt.Errorf("redfish: %w", err)
		}
	}
	return endpoint, creds, tlsConfig, nil
}

// maxSystems bounds the members of a Systems collection: a BMC manages one
// system, or a chassis' few.
const maxSystems = 256

// findSystem fetches the system with id (its Id, @odata.id, the last
// element of the latter, or its Name when exactly one system has it), or
// the only one when id is empty. It does not use gofish's walk of the
// Systems collection, which fetches every member at once, each in its own
// goroutine, and keeps each one whole: it reads the collection's links
// only, and fetches the one system it needs. Given an id, it first fetches
// the system directly, at the collection's link followed by the id, and
// walks the collection only when the BMC answers that it has no such
// system: an answer that refuses the credentials or says the BMC is busy
// ends the search, so that a wrong password costs one failed request.
func findSystem(api *gofish.APIClient, conv *conversation, id string) (*schemas.ComputerSystem, error) {
	var root struct {
		Systems struct {
			ODataID string `json:"@odata.id"`
		}
	}
	if err := getJSON(api, schemas.DefaultServiceRoot, &root); err != nil {
		return nil, fmt.Errorf("reading the service root: %w", err)
	}
	link := root.Systems.ODataID
	if link == "" {
		return nil, bmcerr.New(bmcerr.NotFound, errors.New("its service root links no Systems collection"))
	}
	if id != "" {
		system, done, err := directSystem(api, conv, link, id)
		if done {
			return system, err
		}
	}
	members, err := listMembers(api, link)
	if err != nil {
		return nil, err
	}
	switch {
	case len(members) == 0:
		return nil, bmcerr.New(bmcerr.NotFound, errors.New("it manages no system"))
	case id == "" && len(members) > 1:
		return nil, bmcerr.New(bmcerr.Configuration, fmt.Errorf("it manages %d systems (%s): set redfish.system_id in the inventory", len(members), names(members, func(m string) string { return path.Base(strings.TrimSuffix(m, "/")) })))
	case id == "":
		return getSystem(api, members[0])
	}
	for _, m := range members {
		if matchesLink(m, id) {
			return getSystem(api, m)
		}
	}
	return walkSystems(api, members, id)
}

// directSystem fetches the system at the collection's link followed by
// id (or at id, a path). done reports whether the search ends with its
// answer: the system, when it is the one asked for (its Id or link is id)
// or the one the BMC redirected the request to within its own endpoint
// (as a BMC does for a system named by its Name: 307 to its UUID's path);
// or an error that is not "no such system".
func directSystem(api *gofish.APIClient, conv *conversation, link, id string) (_ *schemas.ComputerSystem, done bool, _ error) {
	direct := id
	if !strings.HasPrefix(id, "/") {
		direct = strings.TrimSuffix(link, "/") + "/" + url.PathEscape(id)
	}
	conv.redirect.Store(nil)
	system, err := schemas.GetComputerSystem(api, direct)
	var status *schemas.Error
	switch {
	case err == nil && (system.ID == id || matchesLink(system.ODataID, id)):
		return system, true, nil
	case err == nil && system.ID != "" && conv.redirectedTo(system.ODataID):
		return system, true, nil
	case err != nil && (!errors.As(err, &status) || final(err)):
		return nil, true, fmt.Errorf("reading system %q: %w", id, err)
	}
	// An answer such as 404: the system's Id is not the last element of
	// its link. Look for it in the collection.
	return nil, false, nil
}

// walkSystems fetches the members one by one, within the conversation's
// bounds, for the one whose Id is id, or else the only one whose Name is.
func walkSystems(api *gofish.APIClient, members []string, id string) (*schemas.ComputerSystem, error) {
	var systems, named []*schemas.ComputerSystem
	for _, m := range members {
		system, err := getSystem(api, m)
		if err != nil {
			return nil, err
		}
		if system.ID == id {
			return system, nil
		}
		if system.Name == id {
			named = append(named, system)
		}
		systems = append(systems, system)
	}
	id2 := func(s *schemas.ComputerSystem) string { return s.ID }
	switch len(named) {
	case 1:
		return named[0], nil
	case 0:
		return nil, bmcerr.New(bmcerr.NotFound, fmt.Errorf("no system %q (systems: %s)", id, names(systems, id2)))
	}
	return nil, bmcerr.New(bmcerr.Configuration, fmt.Errorf("%d systems are named %q (%s): set redfish.system_id to one's Id", len(named), id, names(named, id2)))
}

// matchesLink reports whether a system's @odata.id link is id, or ends in
// the path element id.
func matchesLink(link, id string) bool {
	return link == id || path.Base(strings.TrimSuffix(link, "/")) == id
}

func getSystem(api *gofish.APIClient, link string) (*schemas.ComputerSystem, error) {
	system, err := schemas.GetComputerSystem(api, link)
	if err != nil {
		return nil, fmt.Errorf("reading system %s: %w", short(link), err)
	}
	return system, nil
}

// listMembers returns the links of a collection's members, following
// Members@odata.nextLink; at most maxSystems of them.
func listMembers(api *gofish.APIClient, link string) ([]string, error) {
	var members []string
	for page := 1; link != ""; page++ {
		var collection struct {
			Members []struct {
				ODataID string `json:"@odata.id"`
			}
			NextLink string `json:"Members@odata.nextLink"`
		}
		if err := getJSON(api, link, &collection); err != nil {
			return nil, fmt.Errorf("listing systems (page %d): %w", page, err)
		}
		for _, m := range collection.Members {
			if m.ODataID != "" {
				members = append(members, m.ODataID)
			}
		}
		if len(members) > maxSystems {
			return nil, fmt.Errorf("its Systems collection has more than %d members", maxSystems)
		}
		link = collection.NextLink
	}
	return members, nil
}

// getJSON decodes the answer to a GET of link into v.
func getJSON(api schemas.Client, link string, v any) error {
	resp, err := api.Get(link)
	defer schemas.DeferredCleanupHTTPResponse(resp)
	if err != nil {
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decoding %s: %w", short(link), err)
	}
	return nil
}

// short quotes s, a name from the BMC, cut to a length fit for an error.
func short(s string) string {
	const most = 128
	if len(s) > most {
		return strconv.Quote(strings.ToValidUTF8(s[:most], "")) + "…"
	}
	return strconv.Quote(s)
}

// names renders the first few of items, for an error.
func names[T any](items []T, name func(T) string) string {
	const shown = 8
	var out []string
	for i, item := range items {
		if i == shown {
			out = append(out, fmt.Sprintf("and %d more", len(items)-shown))
			break
		}
		out = append(out, short(name(item)))
	}
	return strings.Join(out, ", ")
}

// contextError prefers the context's error, which says "deadline exceeded"
// plainly, over the transport's rendering of it.
func contextError(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}
