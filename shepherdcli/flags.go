package shepherdcli

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/klog/v2"

	"github.com/shepherd-fleet/shepherd/bmdb"
	"github.com/shepherd-fleet/shepherd/controlloop"
	"github.com/shepherd-fleet/shepherd/daemon"
	"github.com/shepherd-fleet/shepherd/heartbeat"
	"github.com/shepherd-fleet/shepherd/providers"
)

// providerNames lists the providers -provider takes, in the order they
// were registered (the built-in ones first).
func (c *daemonConfig) providerNames() []string {
	var names []string
	for _, p := range c.providers {
		names = append(names, p.Name)
	}
	return names
}

// selected is the definition of the provider -provider selects, or nil
// for an unknown one.
func (c *daemonConfig) selected() *providers.Definition {
	for i := range c.providers {
		if c.providers[i].Name == c.provider {
			return &c.providers[i]
		}
	}
	return nil
}

// daemonConfig is the daemon's command line, parsed and checked.
type daemonConfig struct {
	// prog is the program's name (Daemon.Name), in the demo's hints.
	prog string
	// logFormat is -log_format: text (klog's lines) or json (one JSON
	// object a line, for a log pipeline).
	logFormat       string
	dsn             dsnFlags
	retention       retentionFlags
	listen          string
	statusTokenFile string
	// heartbeatRefusalRate and heartbeatRefusalBurst are each source's
	// bucket of agent key lookups that find no valid key
	// (heartbeat.Options.SourceRate).
	heartbeatRefusalRate  float64
	heartbeatRefusalBurst int
	statusToken           string // read from statusTokenFile by check
	processes             string
	provider              string
	shutdownGrace         time.Duration
	// gracefulShutdownTimeout bounds the whole stop
	// (daemon.Options.GracefulShutdownTimeout).
	gracefulShutdownTimeout time.Duration
	sessionInterval         time.Duration
	stateDir                string
	// demoDefaults lists the flags demo mode changed, for its log.
	demoDefaults []string

	// agentMaxConns, agentMaxConnsPerSource and agentIdleTimeout bound the
	// heartbeat endpoint's connections (heartbeat.Options.MaxConns,
	// MaxConnsPerSource, IdleTimeout).
	agentMaxConns          int
	agentMaxConnsPerSource int
	agentIdleTimeout       time.Duration

	// agentListen is the address of the agents' heartbeat endpoint ("":
	// none), served over TLS when agentTLSCert and agentTLSKey are given.
	agentListen  string
	agentTLSCert string
	agentTLSKey  string

	// providers are the providers the binary registered, sim and static
	// first.
	providers []providers.Definition
	// providerFlags maps every provider-specific flag to its provider, and
	// providerValues to its value.
	providerFlags  map[string]string
	providerValues map[string]flag.Value
	// given names the flags the command line set (not demo mode).
	given []string
	// loops holds every known process with its runner config, in catalogue
	// order; enabled the ones -processes selects.
	loops   []*loop
	enabled []*loop
}

// loop is one registered process with its runner configuration.
type loop struct {
	def controlloop.Definition
	cfg controlloop.Config
}

// newDaemonFlags registers the daemon's flags on fs, with defaults, and
// returns the config they fill in. Flags of every known process and every
// provider are registered whatever -processes and -provider select, so that
// -h shows them all.
func newDaemonFlags(fs *flag.FlagSet, d *CLI) *daemonConfig {
	c := &daemonConfig{
		providers:      d.providers,
		providerFlags:  map[string]string{},
		providerValues: map[string]flag.Value{},
	}
	var byDefault []string
	for _, def := range d.processes {
		c.loops = append(c.loops, &loop{def: def, cfg: controlloop.DefaultConfig(def.Info)})
		if !def.Disabled {
			byDefault = append(byDefault, def.Info.Label)
		}
	}
	known := strings.Join(c.labels(), ",")
	providerUsage := "where machines live and how to act on them: "
	for i, p := range d.providers {
		switch {
		case i == 1:
			providerUsage += " or "
		case i > 1:
			providerUsage += "; "
		}
		providerUsage += p.Name
		if p.Usage != "" {
			providerUsage += " (" + p.Usage + ")"
		}
	}

	c.dsn.register(fs)
	c.retention.register(fs)
	fs.StringVar(&c.listen, "listen", daemon.DefaultListen, "address of the HTTP server for /metrics, /healthz, /readyz and /status (port 0 picks a free one)")
	fs.StringVar(&c.statusTokenFile, "status_token_file", "", "file holding a token that /status requires (as a bearer token, or as the password of HTTP Basic authentication, any user); empty: /status is open to whoever reaches -listen")
	fs.StringVar(&c.processes, "processes", strings.Join(byDefault, ","), "comma-separated processes to run: "+known)
	fs.StringVar(&c.provider, "provider", d.defaultProvider(), providerUsage)
	fs.DurationVar(&c.shutdownGrace, "shutdown_grace", 10*time.Second, "on SIGTERM, how long in-flight work may run before it is cancelled")
	fs.DurationVar(&c.gracefulShutdownTimeout, "graceful_shutdown_timeout", daemon.DefaultGracefulShutdownTimeout, "on SIGTERM, how long the whole stop may take, -shutdown_grace included (unless given: -shutdown_grace plus "+daemon.ShutdownTimeoutRoom.String()+", if that is longer); a part still running then is abandoned and named in the log, and the daemon exits with status 4")
	fs.DurationVar(&c.sessionInterval, "session_interval", daemon.DefaultSessionInterval, "BMDB session lifetime without a heartbeat (heartbeat every half of it); a dead replica's leases are released within about 1.5 times this (expiry, then a live session's next heartbeat reaps)")
	fs.StringVar(&c.stateDir, "state_dir", defaultStateDir, "demo mode (no database given): directory of the private PostgreSQL; kept between runs")
	fs.StringVar(&c.agentListen, "agent_listen", "", "address of the agents' heartbeat endpoint (POST "+heartbeat.Path+"), e.g. :7443 (port 0 picks a free one); empty: none. Required with -provider static unless -agent_heartbeat_url names an endpoint served elsewhere")
	fs.StringVar(&c.agentTLSCert, "agent_tls_cert", "", "PEM certificate (chain) of the heartbeat endpoint; with -agent_tls_key it serves HTTPS instead of HTTP")
	fs.StringVar(&c.agentTLSKey, "agent_tls_key", "", "PEM private key of -agent_tls_cert")
	fs.Float64Var(&c.heartbeatRefusalRate, "agent_refusals_per_second", 20, "agent key lookups that find no valid key (heartbeats of unknown machines, forgeries) a source address may cause per second; beyond them its requests that need a lookup are answered 429. Heartbeats of machines whose key is cached are never limited, however many agents share an address and whatever else it sends")
	fs.IntVar(&c.heartbeatRefusalBurst, "agent_refusals_burst", 40, "burst of -agent_refusals_per_second")
	fs.IntVar(&c.agentMaxConns, "agent_max_conns", heartbeat.DefaultMaxConns, "connections the heartbeat endpoint keeps open, each costing a file descriptor and tens of KiB of memory (so this bounds the endpoint's memory); at the cap, a new connection closes the least recently used one that carries no request, or is closed at once. Keep it below the open files limit (ulimit -n)")
	fs.IntVar(&c.agentMaxConnsPerSource, "agent_max_conns_per_source", heartbeat.DefaultMaxConnsPerSource, "connections one source address (IPv6: one /64) may keep open to the heartbeat endpoint; at the cap, a new one from that address closes the address's least recently used connection that carries no request, or is closed at once. More agents than this behind one NAT still report, each heartbeat on a new connection")
	fs.DurationVar(&c.agentIdleTimeout, "agent_idle_timeout", heartbeat.DefaultIdleTimeout, "how long the heartbeat endpoint keeps a keep-alive connection that carries no request; longer than -agent_heartbeat_interval, so that agents reuse theirs")

	for _, p := range d.providers {
		if p.Flags != nil {
			c.registerProviderFlags(fs, p.Name, p.Flags)
		}
	}
	for _, l := range c.loops {
		l.cfg.RegisterFlags(fs, l.def.Info.Label)
		if l.def.Flags != nil {
			l.def.Flags(fs)
		}
	}
	fs.StringVar(&c.logFormat, "log_format", "text", "log output: text (klog's lines) or json (one JSON object a line, with the keys as fields: process, machine, provider_id, session, result, cause)")
	klog.InitFlags(fs)
	return c
}

// registerProviderFlags registers the flags of a provider's configuration
// on fs and remembers that they belong to provider.
func (c *daemonConfig) registerProviderFlags(fs *flag.FlagSet, provider string, register func(*flag.FlagSet)) {
	own := flag.NewFlagSet(provider, flag.ContinueOnError)
	register(own)
	own.VisitAll(func(f *flag.Flag) {
		fs.Var(f.Value, f.Name, f.Usage)
		c.providerFlags[f.Name] = provider
		c.providerValues[f.Name] = f.Value
	})
}

// noteGiven records the flags the command line set. It runs before demo
// mode changes defaults, which are not the operator's choice.
func (c *daemonConfig) noteGiven(fs *flag.FlagSet) {
	fs.Visit(func(f *flag.Flag) { c.given = append(c.given, f.Name) })
}

// check validates what parsing could not and applies the global settings to
// every loop. Its errors name the flag.
func (c *daemonConfig) check() error {
	if c.logFormat != "text" && c.logFormat != "json" {
		return usagef("-log_format %q: want text or json", c.logFormat)
	}
	provider := c.selected()
	if provider == nil {
		return usagef("-provider %q: unknown provider (known: %s)", c.provider, strings.Join(c.providerNames(), ", "))
	}
	// A flag of another provider is a mistake (most likely a forgotten
	// -provider static), not something to ignore silently.
	for _, name := range c.given {
		if owner, ok := c.providerFlags[name]; ok && owner != c.provider {
			return usagef("-%s: only with -provider %s (the provider is %s)", name, owner, c.provider)
		}
	}
	if c.shutdownGrace < 0 {
		return usagef("-shutdown_grace %s: must not be negative", c.shutdownGrace)
	}
	if c.sessionInterval < time.Second || c.sessionInterval > time.Hour {
		return usagef("-session_interval %s: must be between 1s and 1h", c.sessionInterval)
	}
	if c.shutdownGrace > time.Hour {
		return usagef("-shutdown_grace %s: must be at most 1h", c.shutdownGrace)
	}
	if !slices.Contains(c.given, "graceful_shutdown_timeout") {
		// The daemon's default, which makes room for a longer grace.
		c.gracefulShutdownTimeout = 0
	} else if c.gracefulShutdownTimeout <= c.shutdownGrace || c.gracefulShutdownTimeout > 2*time.Hour {
		return usagef("-graceful_shutdown_timeout %s: must be longer than -shutdown_grace (%s), which is part of the stop, and at most 2h", c.gracefulShutdownTimeout, c.shutdownGrace)
	}
	if !(c.heartbeatRefusalRate > 0 && c.heartbeatRefusalRate <= 1e6) {
		return usagef("-agent_refusals_per_second %g: must be above 0 and at most 1000000", c.heartbeatRefusalRate)
	}
	if c.heartbeatRefusalBurst < 1 || c.heartbeatRefusalBurst > 1e6 {
		return usagef("-agent_refusals_burst %d: must be between 1 and 1000000", c.heartbeatRefusalBurst)
	}
	if c.agentMaxConns < 1 || c.agentMaxConns > 1e6 {
		return usagef("-agent_max_conns %d: must be between 1 and 1000000", c.agentMaxConns)
	}
	if c.agentMaxConnsPerSource < 1 || c.agentMaxConnsPerSource > c.agentMaxConns {
		return usagef("-agent_max_conns_per_source %d: must be between 1 and -agent_max_conns (%d)", c.agentMaxConnsPerSource, c.agentMaxConns)
	}
	if c.agentIdleTimeout < time.Second || c.agentIdleTimeout > time.Hour {
		return usagef("-agent_idle_timeout %s: must be between 1s and 1h", c.agentIdleTimeout)
	}
	if c.statusTokenFile != "" {
		token, err := readSecretFile(c.statusTokenFile)
		if err != nil {
			return usagef("-status_token_file: %v", err)
		}
		c.statusToken = token
	}
	if err := c.retention.check(); err != nil {
		return err
	}
	enabled, err := c.selectLoops()
	if err != nil {
		return err
	}
	c.enabled = enabled
	for _, l := range c.loops {
		l.cfg.ShutdownGrace = c.shutdownGrace
		l.cfg.Session.Interval = c.sessionInterval
		if err := l.cfg.Check(l.def.Info.Label); err != nil {
			return usageError{err.Error()}
		}
		if l.def.Check != nil {
			if err := l.def.Check(); err != nil {
				return usageError{err.Error()}
			}
		}
	}
	if provider.Check != nil {
		if err := provider.Check(); err != nil {
			return usageError{err.Error()}
		}
	}
	return c.checkHeartbeat(provider)
}

// checkHeartbeat checks the heartbeat endpoint's flags and, for a provider
// whose agents report to it (HeartbeatURLFlag) without that flag given,
// that the URL sent to agents can be derived from -agent_listen (the
// daemon derives it).
func (c *daemonConfig) checkHeartbeat(provider *providers.Definition) error {
	if c.agentTLSCert != "" || c.agentTLSKey != "" {
		switch {
		case c.agentTLSCert == "" || c.agentTLSKey == "":
			return usagef("-agent_tls_cert and -agent_tls_key: give both, or neither")
		case c.agentListen == "":
			return usagef("-agent_tls_cert: only with -agent_listen (the heartbeat endpoint it is for)")
		}
		// Loaded now, so that a wrong file stops the daemon at start
		// rather than leaving an endpoint that never serves.
		if _, err := tls.LoadX509KeyPair(c.agentTLSCert, c.agentTLSKey); err != nil {
			return usagef("-agent_tls_cert, -agent_tls_key: %v", err)
		}
	}
	var host, port string
	if c.agentListen != "" {
		var err error
		host, port, err = net.SplitHostPort(c.agentListen)
		if _, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil {
			return usagef("-agent_listen %q: want host:port or :port, e.g. :7443", c.agentListen)
		}
	}
	urlFlag := provider.HeartbeatURLFlag
	if urlFlag == "" {
		return nil
	}
	if v, ok := c.providerValues[urlFlag]; !ok || v.String() != "" {
		// Given (or not a flag of the provider: a mistake of its
		// definition, which then gets what it asked for).
		return nil
	}
	if c.agentListen == "" {
		return usagef("-agent_listen: required with -provider %s: the heartbeat endpoint agents report to (or -%s, when another replica serves it)", provider.Name, urlFlag)
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return usagef("-%s: required, since -agent_listen %s listens on every address and the one machines reach this daemon at cannot be derived from it (e.g. -%s https://shepherd.example:%s%s)", urlFlag, c.agentListen, urlFlag, port, heartbeat.Path)
	}
	return nil
}

// options are the daemon's Options the command line gives, with the DSN
// resolved (dsn) and exts, the migrations of every registered process.
func (c *daemonConfig) options(dsn string, exts []*bmdb.Extension) daemon.Options {
	o := daemon.Options{
		Name:                    c.prog,
		DSN:                     dsn,
		StateDir:                c.stateDir,
		DemoDefaults:            c.demoDefaults,
		Extensions:              exts,
		Provider:                *c.selected(),
		Listen:                  c.listen,
		StatusToken:             c.statusToken,
		SessionInterval:         c.sessionInterval,
		HistoryRetention:        c.retention.daemonRetention(),
		HistoryPruneInterval:    c.retention.every,
		GracefulShutdownTimeout: c.gracefulShutdownTimeout,
		Agents: daemon.AgentOptions{
			Listen:            c.agentListen,
			TLSCert:           c.agentTLSCert,
			TLSKey:            c.agentTLSKey,
			SourceRate:        rate.Limit(c.heartbeatRefusalRate),
			SourceBurst:       c.heartbeatRefusalBurst,
			MaxConns:          c.agentMaxConns,
			MaxConnsPerSource: c.agentMaxConnsPerSource,
			IdleTimeout:       c.agentIdleTimeout,
		},
	}
	for _, l := range c.enabled {
		o.Loops = append(o.Loops, daemon.Loop{Definition: l.def, Config: l.cfg})
	}
	return o
}

// selectLoops parses -processes.
func (c *daemonConfig) selectLoops() ([]*loop, error) {
	var enabled []*loop
	for _, name := range strings.Split(c.processes, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(c.loops, func(l *loop) bool { return l.def.Info.Label == name })
		if i < 0 {
			return nil, usagef("-processes %q: unknown process %q (known: %s)", c.processes, name, strings.Join(c.labels(), ", "))
		}
		if !slices.Contains(enabled, c.loops[i]) {
			enabled = append(enabled, c.loops[i])
		}
	}
	if len(enabled) == 0 {
		return nil, usagef("-processes %q: name at least one process (known: %s)", c.processes, strings.Join(c.labels(), ", "))
	}
	return enabled, nil
}

// labels names the known processes, as -processes takes them.
func (c *daemonConfig) labels() []string {
	var names []string
	for _, l := range c.loops {
		names = append(names, l.def.Info.Label)
	}
	return names
}

// parseFlags parses args with fs's own error output silenced, so that a bad
// flag yields the one line the caller prints, not the flag package's message
// followed by the whole usage. help reports -h / -help.
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	explainDurations(fs)
	err = fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return true, nil
	}
	if err != nil {
		return false, usageError{err.Error()}
	}
	return false, nil
}

const daemonUsage = `Usage: shepherd [run] [flags]

Runs the control loops. With no database given (-bmdb_dsn, -bmdb_dsn_file or
$SHEPHERD_BMDB_DSN) it runs in demo mode: a private PostgreSQL under
-state_dir, migrated, with a simulated fleet.

Other commands: shepherd migrate -h

Flags:
`

func printDaemonUsage(fs *flag.FlagSet, prog string, w io.Writer) {
	fmt.Fprint(w, renamed(prog, daemonUsage))
	printDefaults(fs, prog, w)
}

// printDefaults prints fs's flags to w, with the commands their help
// mentions ("until 'shepherd release'") naming prog.
func printDefaults(fs *flag.FlagSet, prog string, w io.Writer) {
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(w)
	fmt.Fprint(w, renamed(prog, b.String()))
}

// explainDurations makes fs's duration flags say what a bad value is
// wrong with: the flag package answers "-for 5x" with a bare "parse
// error", which names neither the unit nor an example.
func explainDurations(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if _, done := f.Value.(*durationValue); done {
			return
		}
		if g, ok := f.Value.(flag.Getter); ok {
			if _, isDuration := g.Get().(time.Duration); isDuration {
				f.Value = &durationValue{Getter: g, name: f.Name}
			}
		}
	})
}

// durationValue is a duration flag whose errors give an example.
type durationValue struct {
	flag.Getter
	name string
}

func (d *durationValue) Set(s string) error {
	if _, err := time.ParseDuration(s); err != nil {
		return fmt.Errorf("not a duration: give a number and a unit (s, m, h), e.g. -%s 30m or -%s 2h", d.name, d.name)
	}
	return d.Getter.Set(s)
}

// String is the flag's value; the zero durationValue (which the flag
// package makes to tell a default from the zero value) has none.
func (d *durationValue) String() string {
	if d.Getter == nil {
		return time.Duration(0).String()
	}
	return d.Getter.String()
}
