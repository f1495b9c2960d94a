package static

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/shepherd-fleet/shepherd/providers/bmccred"
	"github.com/shepherd-fleet/shepherd/providers/ipmi"
	"github.com/shepherd-fleet/shepherd/providers/redfish"
	"github.com/shepherd-fleet/shepherd/untrusted"
)

// Inventory is a parsed, validated inventory file.
//
// The file is YAML (JSON, being YAML, works too):
//
//	# Optional: values for machines that do not set them.
//	defaults:
//	  ssh:
//	    user: root
//	    port: 22
//	  redfish:
//	    credentials_file: secrets/bmc.json  # relative to this file
//	    reset_type: ForceRestart
//	machines:
//	  - id: rack1-node01          # provider id, unique, never reused
//	    location: dc1/rack1/u01   # free text
//	    ssh:
//	      address: 10.0.1.1       # host name or IP address, no port
//	      port: 22
//	      user: root
//	    redfish:                  # optional: no BMC means reboots over SSH
//	      endpoint: https://10.0.101.1
//	      credentials_file: secrets/rack1-node01.bmc
//	      system_id: System.Embedded.1   # optional when the BMC has one system
//	      reset_type: ForceRestart       # optional
//	      ca_file: bmc-ca.pem            # optional
//
// The top level may also be the list of machines alone. Unknown fields,
// duplicate ids, duplicate SSH addresses and unparsable values are errors
// naming the file, line and field.
type Inventory struct {
	// File is the file it was read from.
	File string
	// Machines are in file order.
	Machines []Machine

	byID map[string]*Machine
}

// Machine is one machine of the inventory.
type Machine struct {
	// ID is the provider id: machine_provided.provider_id.
	ID string
	// Location is free text for operators: machine_provided.location.
	Location string
	// SSH says how to log in to the machine.
	SSH SSH
	// Redfish is the machine's BMC, or nil when it has none (reboots then
	// go over SSH).
	Redfish *redfish.Target
	// IPMI is the machine's BMC over IPMI 2.0, or nil.
	IPMI *ipmi.Target
	// Power is how the machine is rebooted: PowerRedfish, PowerIPMI or
	// PowerSSH, from the inventory's power key, or from the one BMC
	// section it has.
	Power string
	// Line is where the machine's entry starts in the file.
	Line int
}

// Reboot methods, the values of a machine's power key.
const (
	PowerRedfish = "redfish"
	PowerIPMI    = ipmi.Method
	PowerSSH     = "ssh"
)

// SSH is a machine's SSH login.
type SSH struct {
	// Host is a host name or an IP address.
	Host string
	// Port is the TCP port (default 22).
	Port int
	// User is the login user.
	User string
}

// Address is host:port, the form stored in machine_provided.address.
func (s SSH) Address() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Machine returns the machine with provider id id.
func (inv *Inventory) Machine(id string) (*Machine, bool) {
	m, ok := inv.byID[id]
	return m, ok
}

// FieldError is one problem of an inventory file, at a line and a field.
type FieldError struct {
	File string
	Line int
	// Field is the field's path, e.g. machines[3].ssh.port.
	Field string
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// Error is a rejected inventory file: every problem found, in file order.
type Error struct {
	File     string
	Problems []*FieldError
}

// maxProblems bounds how many problems one error lists.
const maxProblems = 20

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "inventory %s rejected:", e.File)
	if len(e.Problems) == 1 {
		return b.String() + " " + e.Problems[0].Error()
	}
	for i, p := range e.Problems {
		if i == maxProblems {
			fmt.Fprintf(&b, "\n  ... and %d more", len(e.Problems)-maxProblems)
			break
		}
		b.WriteString("\n  " + p.Error())
	}
	return b.String()
}

// Load reads and parses an inventory file. Relative file names in it
// (credentials_file, ca_file) are relative to the file's directory.
//
// Only a regular file is read (symlinks followed), and at most
// maxInventorySize bytes of it: a FIFO would block a reload (and shutdown
// behind it), a link to /dev/zero would grow the daemon's memory without end.
func Load(file string) (*Inventory, error) {
	data, err := untrusted.ReadFile(file, maxInventorySize)
	if err != nil {
		return nil, fmt.Errorf("reading inventory: %w", err)
	}
	return Parse(file, data)
}

// maxInventorySize bounds an inventory file (about 200 bytes per machine
// leaves room for a hundred thousand machines).
const maxInventorySize = 64 << 20

// Parse parses an inventory; file names it in errors and anchors relative
// file names. Referenced files (credentials, CAs) must exist and parse.
func Parse(file string, data []byte) (*Inventory, error) {
	p := &parser{file: file, dir: filepath.Dir(file)}
	if len(data) > maxInventorySize {
		p.addf(1, "", "file is larger than %d bytes", maxInventorySize)
		return nil, p.err()
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.addf(1, "", "empty file: want a list of machines or a mapping with \"machines\"")
			return nil, p.err()
		}
		p.addf(yamlErrorLine(err), "", "not valid YAML or JSON: %s", yamlErrorText(err))
		return nil, p.err()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.addf(extra.Line, "", "more than one YAML document")
		return nil, p.err()
	}
	inv := p.document(&doc)
	if len(p.problems) > 0 {
		return nil, p.err()
	}
	return inv, nil
}

// yamlErrorLine extracts the line from a yaml.v3 error ("yaml: line 3: ...").
var yamlLineRE = regexp.MustCompile(`line (\d+)`)

func yamlErrorLine(err error) int {
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 1
}

func yamlErrorText(err error) string {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	if i := strings.Index(s, ": "); i >= 0 && strings.HasPrefix(s, "line ") {
		s = s[i+2:]
	}
	return s
}

// parser walks the YAML tree, collecting problems.
type parser struct {
	file     string
	dir      string
	problems []*FieldError
}

func (p *parser) addf(line int, field, format string, args ...any) {
	p.problems = append(p.problems, &FieldError{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) err() error {
	return &Error{File: p.file, Problems: p.problems}
}

// defaults are the optional defaults section.
type defaults struct {
	sshUser string
	sshPort int
	redfish redfish.Target
}

func (p *parser) document(doc *yaml.Node) *Inventory {
	inv := &Inventory{File: p.file, byID: map[string]*Machine{}}
	root := resolve(doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = resolve(root.Content[0])
	}
	var machines *yaml.Node
	d := defaults{sshPort: 22}
	switch root.Kind {
	case yaml.SequenceNode:
		machines = root
	case yaml.MappingNode:
		p.fields(root, "", map[string]func(key, value *yaml.Node){
			"machines": func(_, v *yaml.Node) { machines = v },
			"defaults": func(_, v *yaml.Node) { d = p.defaults(v) },
		})
		if machines == nil {
			p.addf(root.Line, "machines", "missing")
			return inv
		}
	default:
		p.addf(root.Line, "", "want a list of machines or a mapping with \"machines\", found %s", kindName(root))
		return inv
	}
	machines = resolve(machines)
	if machines.Kind != yaml.SequenceNode {
		p.addf(machines.Line, "machines", "want a list, found %s", kindName(machines))
		return inv
	}
	firstAddr := map[string]int{}
	firstID := map[string]int{}
	for i, n := range machines.Content {
		m, ok := p.machine(resolve(n), fmt.Sprintf("machines[%d]", i), d)
		if !ok {
			continue
		}
		if line, dup := firstID[m.ID]; dup {
			p.addf(m.Line, fmt.Sprintf("machines[%d].id", i), "duplicate id %q (first at line %d)", m.ID, line)
			continue
		}
		firstID[m.ID] = m.Line
		if line, dup := firstAddr[m.SSH.Address()]; dup {
			p.addf(m.Line, fmt.Sprintf("machines[%d].ssh.address", i), "SSH address %s is also the address of the machine at line %d", m.SSH.Address(), line)
			continue
		}
		firstAddr[m.SSH.Address()] = m.Line
		inv.Machines = append(inv.Machines, m)
	}
	for i := range inv.Machines {
		inv.byID[inv.Machines[i].ID] = &inv.Machines[i]
	}
	return inv
}

func (p *parser) defaults(n *yaml.Node) defaults {
	d := defaults{sshPort: 22}
	p.mapping(n, "defaults", map[string]func(key, value *yaml.Node){
		"ssh": func(_, v *yaml.Node) {
			p.mapping(v, "defaults.ssh", map[string]func(key, value *yaml.Node){
				"user": func(_, v *yaml.Node) { d.sshUser, _ = p.user(v, "defaults.ssh.user") },
				"port": func(_, v *yaml.Node) { d.sshPort, _ = p.port(v, "defaults.ssh.port") },
			})
		},
		"redfish": func(_, v *yaml.Node) {
			p.mapping(v, "defaults.redfish", map[string]func(key, value *yaml.Node){
				"credentials_file": func(_, v *yaml.Node) {
					d.redfish.CredentialsFile, _ = p.credentialsFile(v, "defaults.redfish.credentials_file")
				},
				"reset_type": func(_, v *yaml.Node) {
					d.redfish.ResetType, _ = p.resetType(v, "defaults.redfish.reset_type")
				},
				"ca_file": func(_, v *yaml.Node) { d.redfish.CAFile, _ = p.caFile(v, "defaults.redfish.ca_file") },
			})
		},
	})
	return d
}

func (p *parser) machine(n *yaml.Node, path string, d defaults) (Machine, bool) {
	m := Machine{Line: n.Line, SSH: SSH{Port: d.sshPort, User: d.sshUser}}
	powerLine := n.Line
	before := len(p.problems)
	// Presence is tracked apart from validity: a field that is present but
	// invalid has been reported already and is not "missing" too.
	var hasID, hasSSH, hasAddress, hasUser bool
	var sshLine int
	ok := p.mapping(n, path, map[string]func(key, value *yaml.Node){
		"id": func(_, v *yaml.Node) {
			hasID = true
			m.ID, _ = p.id(v, path+".id")
		},
		"location": func(_, v *yaml.Node) { m.Location, _ = p.text(v, path+".location", 1024) },
		"ssh": func(k, v *yaml.Node) {
			hasSSH, sshLine = true, k.Line
			if !p.mapping(v, path+".ssh", map[string]func(key, value *yaml.Node){
				"address": func(_, v *yaml.Node) {
					hasAddress = true
					m.SSH.Host, _ = p.host(v, path+".ssh.address")
				},
				"port": func(_, v *yaml.Node) { m.SSH.Port, _ = p.port(v, path+".ssh.port") },
				"user": func(_, v *yaml.Node) {
					hasUser = true
					m.SSH.User, _ = p.user(v, path+".ssh.user")
				},
			}) {
				hasAddress, hasUser = true, true // reported as not a mapping
			}
		},
		"redfish": func(k, v *yaml.Node) { m.Redfish = p.redfishSection(k, v, path, d) },
		"ipmi":    func(k, v *yaml.Node) { m.IPMI = p.ipmiSection(k, v, path) },
		"power": func(k, v *yaml.Node) {
			powerLine = v.Line
			m.Power, _ = p.oneOf(v, path+".power", []string{PowerRedfish, PowerIPMI, PowerSSH})
		},
	})
	if !ok {
		return m, false
	}
	if !hasID {
		p.addf(n.Line, path+".id", "missing")
	}
	// How the machine is rebooted: what power says, else its only BMC.
	switch {
	case m.Power == "" && m.Redfish != nil && m.IPMI != nil:
		p.addf(n.Line, path+".power", "missing: the machine has both a redfish and an ipmi section; say which reboots it (power: redfish or power: ipmi)")
	case m.Power == "" && m.Redfish != nil:
		m.Power = PowerRedfish
	case m.Power == "" && m.IPMI != nil:
		m.Power = PowerIPMI
	case m.Power == "":
		m.Power = PowerSSH
	case m.Power == PowerRedfish && m.Redfish == nil, m.Power == PowerIPMI && m.IPMI == nil:
		p.addf(powerLine, path+".power", "%s: the machine has no %s section", m.Power, m.Power)
	}
	switch {
	case !hasSSH:
		p.addf(n.Line, path+".ssh", "missing: every machine needs an SSH address")
	case !hasAddress:
		p.addf(sshLine, path+".ssh.address", "missing")
	case !hasUser && d.sshUser == "":
		p.addf(sshLine, path+".ssh.user", "missing, and no defaults.ssh.user")
	}
	return m, len(p.problems) == before
}

// redfishSection parses a machine's redfish section, at key k and value
// v, over the inventory's defaults d; nil if it is not a mapping.
func (p *parser) redfishSection(k, v *yaml.Node, path string, d defaults) *redfish.Target {
	rf := d.redfish
	var hasEndpoint, hasCredentials bool
	endpointLine := k.Line
	if p.mapping(v, path+".redfish", map[string]func(key, value *yaml.Node){
		"endpoint": func(_, v *yaml.Node) {
			hasEndpoint = true
			endpointLine = v.Line
			rf.Endpoint, _ = p.endpoint(v, path+".redfish.endpoint")
		},
		"allow_http": func(_, v *yaml.Node) { rf.AllowHTTP, _ = p.boolean(v, path+".redfish.allow_http") },
		"credentials_file": func(_, v *yaml.Node) {
			hasCredentials = true
			rf.CredentialsFile, _ = p.credentialsFile(v, path+".redfish.credentials_file")
		},
		"system_id": func(_, v *yaml.Node) { rf.SystemID, _ = p.text(v, path+".redfish.system_id", 255) },
		"reset_type": func(_, v *yaml.Node) {
			rf.ResetType, _ = p.resetType(v, path+".redfish.reset_type")
		},
		"ca_file": func(_, v *yaml.Node) { rf.CAFile, _ = p.caFile(v, path+".redfish.ca_file") },
	}) {
		if !hasEndpoint {
			p.addf(k.Line, path+".redfish.endpoint", "missing (a machine without a BMC has no redfish section)")
		}
		if strings.HasPrefix(rf.Endpoint, "http://") && !rf.AllowHTTP {
			p.addf(endpointLine, path+".redfish.endpoint", "%v", redfish.ErrCleartext)
		}
		if !hasCredentials && d.redfish.CredentialsFile == "" {
			p.addf(k.Line, path+".redfish.credentials_file", "missing, and no defaults.redfish.credentials_file")
		}
		return &rf
	}
	return nil
}

// ipmiSection parses a machine's ipmi section, at key k and value v; nil
// if it is not a mapping.
func (p *parser) ipmiSection(k, v *yaml.Node, path string) *ipmi.Target {
	t := ipmi.Target{Port: ipmi.DefaultPort}
	var hasAddress, hasCredentials bool
	if p.mapping(v, path+".ipmi", map[string]func(key, value *yaml.Node){
		"address": func(_, v *yaml.Node) {
			hasAddress = true
			t.Address, _ = p.host(v, path+".ipmi.address")
		},
		"port": func(_, v *yaml.Node) { t.Port, _ = p.port(v, path+".ipmi.port") },
		"credentials_file": func(_, v *yaml.Node) {
			hasCredentials = true
			t.CredentialsFile, _ = p.credentialsFile(v, path+".ipmi.credentials_file")
		},
		"cipher_suite": func(_, v *yaml.Node) { t.CipherSuite, _ = p.cipherSuite(v, path+".ipmi.cipher_suite") },
		"privilege": func(_, v *yaml.Node) {
			t.Privilege, _ = p.oneOf(v, path+".ipmi.privilege", ipmi.Privileges)
		},
		"reset_type": func(_, v *yaml.Node) {
			t.ResetType, _ = p.oneOf(v, path+".ipmi.reset_type", ipmi.ResetTypes)
		},
	}) {
		if !hasAddress {
			p.addf(k.Line, path+".ipmi.address", "missing (a machine without an IPMI BMC has no ipmi section)")
		}
		if !hasCredentials {
			p.addf(k.Line, path+".ipmi.credentials_file", "missing")
		}
		return &t
	}
	return nil
}

// mapping checks that n is a mapping whose keys are all in fields, each at
// most once, and calls the field's function for each.
func (p *parser) mapping(n *yaml.Node, path string, fields map[string]func(key, value *yaml.Node)) bool {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.addf(n.Line, path, "want a mapping, found %s", kindName(n))
		return false
	}
	p.fields(n, path, fields)
	return true
}

func (p *parser) fields(n *yaml.Node, path string, fields map[string]func(key, value *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := k.Value
		if path != "" {
			field = path + "." + k.Value
		}
		fn, known := fields[k.Value]
		if k.Kind != yaml.ScalarNode || !known {
			p.addf(k.Line, field, "unknown field (known: %s)", knownFields(fields))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			p.addf(k.Line, field, "set twice (first at line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		fn(k, v)
	}
}

func knownFields(fields map[string]func(key, value *yaml.Node)) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// scalar returns n's value if it is a non-null scalar.
func (p *parser) scalar(n *yaml.Node, field string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.addf(n.Line, field, "want a value, found %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

// text is a printable string of at most max bytes.
func (p *parser) text(n *yaml.Node, field string, max int) (string, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return "", false
	}
	switch {
	case len(s) > max:
		p.addf(n.Line, field, "longer than %d bytes", max)
	case !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		p.addf(n.Line, field, "contains control characters")
	default:
		return s, true
	}
	return "", false
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,254}$`)

func (p *parser) id(n *yaml.Node, field string) (string, bool) {
	return parsed(p, n, field, p.scalar, want(idRE.MatchString, "1 to 255 letters, digits or ._:@/+- starting with a letter or digit"))
}

var hostLabelRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// host accepts an IP address or a DNS name, without a port.
func (p *parser) host(n *yaml.Node, field string) (string, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return "", false
	}
	if ip := net.ParseIP(s); ip != nil {
		return ip.String(), true
	}
	if h, port, err := net.SplitHostPort(s); err == nil {
		p.addf(n.Line, field, "%q includes a port: write address: %s and port: %s", clip(s), h, port)
		return "", false
	}
	name := strings.TrimSuffix(s, ".")
	valid := name != "" && len(name) <= 253
	for _, label := range strings.Split(name, ".") {
		valid = valid && hostLabelRE.MatchString(label)
	}
	if !valid {
		p.addf(n.Line, field, "%q is neither an IP address nor a host name", clip(s))
		return "", false
	}
	return s, true
}

func (p *parser) port(n *yaml.Node, field string) (int, bool) {
	return parsed(p, n, field, p.scalar, wantInt(func(port int) bool { return port >= 1 && port <= 65535 }, "a port number between 1 and 65535"))
}

var userRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)

func (p *parser) user(n *yaml.Node, field string) (string, bool) {
	return parsed(p, n, field, p.scalar, want(userRE.MatchString, "a user name of letters, digits and ._-"))
}

func (p *parser) endpoint(n *yaml.Node, field string) (string, bool) {
	// ParseEndpoint's errors never quote the URL: it may hold a password.
	return parsed(p, n, field, p.scalar, redfish.ParseEndpoint)
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, bool) {
	s, ok := p.scalar(n, field)
	if !ok {
		return false, false
	}
	switch s {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	p.addf(n.Line, field, "%q: want true or false", s)
	return false, false
}

func (p *parser) resetType(n *yaml.Node, field string) (string, bool) {
	return p.oneOf(n, field, redfish.ResetTypes)
}

// path resolves a file name relative to the inventory's directory.
func (p *parser) path(n *yaml.Node, field string) (string, bool) {
	s, ok := p.text(n, field, 4096)
	if !ok || s == "" {
		if ok {
			p.addf(n.Line, field, "empty file name")
		}
		return "", false
	}
	if !filepath.IsAbs(s) {
		s = filepath.Join(p.dir, s)
	}
	return s, true
}

// credentialsFile (a Redfish or IPMI BMC's, package bmccred) must exist
// and parse, as must a CA file; their content is not kept (it is read
// again at each use, so that rotation needs no reload) and never quoted.
func (p *parser) credentialsFile(n *yaml.Node, field string) (string, bool) {
	return parsed(p, n, field, p.path, checkFile(func(file string) error {
		_, err := bmccred.Read(file)
		return err
	}))
}

func (p *parser) caFile(n *yaml.Node, field string) (string, bool) {
	return parsed(p, n, field, p.path, checkFile(func(file string) error {
		_, err := redfish.LoadCAFile(file)
		return err
	}))
}

func (p *parser) cipherSuite(n *yaml.Node, field string) (int, bool) {
	return parsed(p, n, field, p.scalar, wantInt(ipmi.ValidCipherSuite, "an RMCP+ cipher suite number between 0 and 17 (3 is the one every BMC offers)"))
}

func (p *parser) oneOf(n *yaml.Node, field string, values []string) (string, bool) {
	return parsed(p, n, field, p.scalar, want(func(s string) bool { return slices.Contains(values, s) }, "one of "+strings.Join(values, ", ")))
}

// parsed reads a field with read (p.scalar, p.path) and converts the value
// with parse, reporting parse's error on the field: the one way every
// field's problem reaches the list of problems.
func parsed[T any](p *parser, n *yaml.Node, field string, read func(*yaml.Node, string) (string, bool), parse func(string) (T, error)) (T, bool) {
	var zero T
	s, ok := read(n, field)
	if !ok {
		return zero, false
	}
	v, err := parse(s)
	if err != nil {
		p.addf(n.Line, field, "%v", err)
		return zero, false
	}
	return v, true
}

// want accepts a value that valid accepts, and otherwise quotes the value
// (clipped) and says what is wanted instead.
func want(valid func(string) bool, wanted string) func(string) (string, error) {
	return func(s string) (string, error) {
		if !valid(s) {
			return "", fmt.Errorf("%q: want %s", clip(s), wanted)
		}
		return s, nil
	}
}

// wantInt is want for a whole number.
func wantInt(valid func(int) bool, wanted string) func(string) (int, error) {
	return func(s string) (int, error) {
		v, err := strconv.Atoi(s)
		if err != nil || !valid(v) {
			return 0, fmt.Errorf("%q: want %s", clip(s), wanted)
		}
		return v, nil
	}
}

// checkFile accepts a file name that check accepts; its error must not
// quote the file's content.
func checkFile(check func(file string) error) func(string) (string, error) {
	return func(file string) (string, error) {
		return file, check(file)
	}
}

// resolve follows aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing (null)"
		}
		return fmt.Sprintf("%q", clip(n.Value))
	case yaml.DocumentNode:
		return "a document"
	}
	return "an alias"
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
