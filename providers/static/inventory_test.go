package static

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeFiles creates files in dir, returning dir.
func writeFiles(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const fullInventory = `# A small fleet.
defaults:
  ssh:
    user: shepherd
  redfish:
    credentials_file: secrets/bmc
machines:
  - id: rack1-node01
    location: dc1/rack1/u01
    ssh:
      address: 10.0.1.1
    redfish:
      endpoint: https://10.0.101.1/
      system_id: System.Embedded.1
  - id: rack1-node02
    ssh:
      address: node02.example.com
      port: 2222
      user: root
    redfish:
      endpoint: http://[fd00::2]:8080
      allow_http: true
      credentials_file: /ABS/other.json
      reset_type: PowerCycle
  - id: "12"
    ssh: {address: "fd00::3"}
`

func TestParseFullInventory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"secrets/bmc": "admin:pw\n",
		"other.json":  `{"username": "root", "password": "calvin"}`,
	})
	file := filepath.Join(dir, "inventory.yaml")
	inv, err := Parse(file, []byte(strings.ReplaceAll(fullInventory, "/ABS", dir)))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(inv.Machines) != 3 {
		t.Fatalf("got %d machines, want 3", len(inv.Machines))
	}
	m1, ok := inv.Machine("rack1-node01")
	if !ok {
		t.Fatal("rack1-node01 missing")
	}
	if m1.SSH.Address() != "10.0.1.1:22" || m1.SSH.User != "shepherd" || m1.Location != "dc1/rack1/u01" || m1.Line != 8 {
		t.Errorf("rack1-node01 = %+v", m1)
	}
	if rf := m1.Redfish; rf == nil || rf.Endpoint != "https://10.0.101.1" || rf.CredentialsFile != filepath.Join(dir, "secrets/bmc") || rf.SystemID != "System.Embedded.1" || rf.ResetType != "" {
		t.Errorf("rack1-node01 redfish = %+v", m1.Redfish)
	}
	m2, _ := inv.Machine("rack1-node02")
	if m2.SSH.Address() != "node02.example.com:2222" || m2.SSH.User != "root" {
		t.Errorf("rack1-node02 = %+v", m2)
	}
	if rf := m2.Redfish; rf == nil || rf.Endpoint != "http://[fd00::2]:8080" || rf.CredentialsFile != filepath.Join(dir, "other.json") || rf.ResetType != "PowerCycle" {
		t.Errorf("rack1-node02 redfish = %+v", m2.Redfish)
	}
	m3, _ := inv.Machine("12")
	if m3.SSH.Address() != "[fd00::3]:22" || m3.Redfish != nil {
		t.Errorf("machine 12 = %+v", m3)
	}
}

func TestParseJSONAndPlainList(t *testing.T) {
	json := `[
  {"id": "a", "ssh": {"address": "127.0.0.1", "port": 2201, "user": "root"}},
  {"id": "b", "ssh": {"address": "127.0.0.1", "port": 2202, "user": "root"}, "location": "lab"}
]`
	inv, err := Parse("inv.json", []byte(json))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(inv.Machines) != 2 || inv.Machines[1].Location != "lab" || inv.Machines[1].SSH.Port != 2202 {
		t.Fatalf("machines = %+v", inv.Machines)
	}
	_, err = Parse("inv.json", []byte(`{"machines": [
  {"id": "a",
   "ssh": {"address": "127.0.0.1", "user": "root", "prot": 22}}
]}`))
	wantProblems(t, err, "inv.json:3: machines[0].ssh.prot: unknown field (known: address, port, user)")
}

func wantProblems(t *testing.T, err error, want ...string) {
	t.Helper()
	var invErr *Error
	if !errors.As(err, &invErr) {
		t.Fatalf("err = %v, want an *Error", err)
	}
	var got []string
	for _, p := range invErr.Problems {
		got = append(got, p.Error())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestParseErrorsNameLineAndField(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"creds":     "admin:pw",
		"badcreds":  "no colon here",
		"notpem.ca": "hello",
	})
	f := filepath.Join(dir, "inv.yaml")
	for _, tc := range []struct {
		name string
		yaml string
		want []string
	}{{
		name: "unknown field",
		yaml: "machines:\n  - id: a\n    adress: x\n    ssh: {address: h, user: u}\n",
		want: []string{f + ":3: machines[0].adress: unknown field (known: id, ipmi, location, power, redfish, ssh)"},
	}, {
		name: "unknown top-level field",
		yaml: "machine:\n  - id: a\n",
		want: []string{f + ":1: machine: unknown field (known: defaults, machines)", f + ":1: machines: missing"},
	}, {
		name: "duplicate id",
		yaml: "- id: a\n  ssh: {address: h1, user: u}\n- id: a\n  ssh: {address: h2, user: u}\n",
		want: []string{f + `:3: machines[1].id: duplicate id "a" (first at line 1)`},
	}, {
		name: "duplicate address",
		yaml: "- id: a\n  ssh: {address: h1, user: u}\n- id: b\n  ssh: {address: h1, port: 22, user: u}\n",
		want: []string{f + ":3: machines[1].ssh.address: SSH address h1:22 is also the address of the machine at line 1"},
	}, {
		name: "field twice",
		yaml: "- id: a\n  id: b\n  ssh: {address: h1, user: u}\n",
		want: []string{f + ":2: machines[0].id: set twice (first at line 1)"},
	}, {
		name: "bad values",
		yaml: `- id: "bad id"
  ssh:
    address: "host:22"
    port: 70000
    user: "x y"
- id: b
  ssh:
    address: "-bad-.example"
    port: ssh
    user: u
`,
		want: []string{
			f + `:1: machines[0].id: "bad id": want 1 to 255 letters, digits or ._:@/+- starting with a letter or digit`,
			f + `:3: machines[0].ssh.address: "host:22" includes a port: write address: host and port: 22`,
			f + `:4: machines[0].ssh.port: "70000": want a port number between 1 and 65535`,
			f + `:5: machines[0].ssh.user: "x y": want a user name of letters, digits and ._-`,
			f + `:8: machines[1].ssh.address: "-bad-.example" is neither an IP address nor a host name`,
			f + `:9: machines[1].ssh.port: "ssh": want a port number between 1 and 65535`,
		},
	}, {
		name: "missing fields",
		yaml: "- location: x\n- id: b\n  ssh: {port: 22}\n- id: c\n  ssh: {address: h}\n",
		want: []string{
			f + ":1: machines[0].id: missing",
			f + ":1: machines[0].ssh: missing: every machine needs an SSH address",
			f + ":3: machines[1].ssh.address: missing",
			f + ":5: machines[2].ssh.user: missing, and no defaults.ssh.user",
		},
	}, {
		name: "redfish problems",
		yaml: `- id: a
  ssh: {address: h1, user: u}
  redfish:
    endpoint: https://root:hunter2@bmc
    credentials_file: creds
- id: b
  ssh: {address: h2, user: u}
  redfish:
    endpoint: https://bmc2
    credentials_file: badcreds
    reset_type: ForceOff
    ca_file: notpem.ca
- id: c
  ssh: {address: h3, user: u}
  redfish:
    credentials_file: missing-file
`,
		want: []string{
			f + ":4: machines[0].redfish.endpoint: credentials in the URL are refused: put them in credentials_file",
			f + ":10: machines[1].redfish.credentials_file: BMC credentials file " + filepath.Join(dir, "badcreds") + ": no colon; want username:password",
			f + `:11: machines[1].redfish.reset_type: "ForceOff": want one of ForceRestart, GracefulRestart, PowerCycle, FullPowerCycle`,
			f + ":12: machines[1].redfish.ca_file: CA file " + filepath.Join(dir, "notpem.ca") + ": no PEM certificate in it",
			f + ":16: machines[2].redfish.credentials_file: reading BMC credentials: stat " + filepath.Join(dir, "missing-file") + ": no such file or directory",
			f + ":15: machines[2].redfish.endpoint: missing (a machine without a BMC has no redfish section)",
		},
	}, {
		name: "wrong shapes",
		yaml: "machines:\n  - just-a-string\n  - id: [1, 2]\n    ssh: x\n",
		want: []string{
			f + `:2: machines[0]: want a mapping, found "just-a-string"`,
			f + ":3: machines[1].id: want a value, found a list",
			f + `:4: machines[1].ssh: want a mapping, found "x"`,
		},
	}, {
		name: "syntax error",
		yaml: "machines:\n  - id: a\n    ssh: x: y\n",
		want: []string{f + ":3: not valid YAML or JSON: mapping values are not allowed in this context"},
	}, {
		name: "empty",
		yaml: "",
		want: []string{f + `:1: empty file: want a list of machines or a mapping with "machines"`},
	}, {
		name: "scalar",
		yaml: "hello\n",
		want: []string{f + `:1: want a list of machines or a mapping with "machines", found "hello"`},
	}, {
		name: "bad defaults",
		yaml: "defaults:\n  ssh:\n    port: 0\n  redfsh: {}\nmachines: []\n",
		want: []string{
			f + `:3: defaults.ssh.port: "0": want a port number between 1 and 65535`,
			f + ":4: defaults.redfsh: unknown field (known: redfish, ssh)",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(f, []byte(tc.yaml))
			wantProblems(t, err, tc.want...)
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error quotes a password: %v", err)
			}
		})
	}
}

func TestLoadReportsMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not-exist", err)
	}
}

// Only a regular file is read, and only so much of it: a FIFO (which would
// block a reload, and shutdown behind it) and a link to /dev/zero (which
// would grow memory without end) are refused at once.
func TestLoadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{fifo, zero, dir} {
		done := make(chan error, 1)
		go func() { _, err := Load(file); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("Load(%s) = %v, want a refusal", file, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Load(%s) blocked", file)
		}
	}
}

// An http:// Redfish endpoint needs allow_http: true on its machine, and
// allow_http takes only true or false.
func TestHTTPRedfishEndpointNeedsAllowHTTP(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds")
	if err := os.WriteFile(creds, []byte("admin:pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "inv.yaml")
	_, err := Parse(file, []byte(`machines:
  - id: a
    ssh: {address: 10.0.0.1, user: root}
    redfish:
      endpoint: http://10.0.100.1
      credentials_file: creds
  - id: b
    ssh: {address: 10.0.0.2, user: root}
    redfish:
      endpoint: http://10.0.100.2
      allow_http: yes-please
      credentials_file: creds
  - id: c
    ssh: {address: 10.0.0.3, user: root}
    redfish:
      endpoint: http://10.0.100.3
      allow_http: true
      credentials_file: creds
`))
	for _, want := range []string{
		file + ":5: machines[0].redfish.endpoint: http:// would send the BMC's password in cleartext",
		file + `:11: machines[1].redfish.allow_http: "yes-please": want true or false`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse: %v\nwant a problem %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "machines[2]") {
		t.Errorf("machine c allows http but was refused: %v", err)
	}
}

// A machine's ipmi section, and which BMC reboots a machine that has two.
func TestIPMIInventory(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "ipmi.creds")
	if err := os.WriteFile(creds, []byte("admin:pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.creds")
	if err := os.WriteFile(open, []byte("admin:pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o644)
	file := filepath.Join(dir, "inv.yaml")
	inv, err := Parse(file, []byte(`machines:
  - id: a
    ssh: {address: 10.0.0.1, user: root}
    ipmi:
      address: 10.0.100.1
      credentials_file: ipmi.creds
  - id: b
    ssh: {address: 10.0.0.2, user: root}
    power: ipmi
    redfish: {endpoint: "https://10.0.101.2", credentials_file: ipmi.creds}
    ipmi: {address: bmc-b.example, port: 6230, credentials_file: ipmi.creds, cipher_suite: 17, privilege: operator, reset_type: hard_reset}
  - id: c
    ssh: {address: 10.0.0.3, user: root}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := inv.Machines[0], inv.Machines[1], inv.Machines[2]
	if a.Power != PowerIPMI || a.IPMI == nil || a.IPMI.Port != 623 || a.IPMI.Address != "10.0.100.1" {
		t.Errorf("a: power %q, ipmi %+v", a.Power, a.IPMI)
	}
	if b.Power != PowerIPMI || b.IPMI.Port != 6230 || b.IPMI.CipherSuite != 17 || b.IPMI.Privilege != "operator" || b.IPMI.ResetType != "hard_reset" {
		t.Errorf("b: power %q, ipmi %+v", b.Power, b.IPMI)
	}
	if c.Power != PowerSSH {
		t.Errorf("c: power %q, want ssh", c.Power)
	}

	_, err = Parse(file, []byte(`machines:
  - id: a
    ssh: {address: 10.0.0.1, user: root}
    redfish: {endpoint: "https://10.0.101.1", credentials_file: ipmi.creds}
    ipmi: {address: 10.0.100.1, credentials_file: ipmi.creds}
  - id: b
    ssh: {address: 10.0.0.2, user: root}
    power: ipmi
    ipmi:
      address: 10.0.100.2
      port: 70000
      cipher_suite: 99
      privilege: god
      reset_type: explode
      credentials_file: open.creds
  - id: c
    ssh: {address: 10.0.0.3, user: root}
    power: redfish
`))
	for _, want := range []string{
		file + ":2: machines[0].power: missing: the machine has both a redfish and an ipmi section",
		file + `:11: machines[1].ipmi.port: "70000": want a port number between 1 and 65535`,
		file + `:12: machines[1].ipmi.cipher_suite: "99": want an RMCP+ cipher suite number`,
		file + `:13: machines[1].ipmi.privilege: "god": want one of operator, administrator`,
		file + `:14: machines[1].ipmi.reset_type: "explode": want one of power_cycle, hard_reset`,
		file + ":15: machines[1].ipmi.credentials_file: reading BMC credentials: " + open + " is accessible by others (mode 0644)",
		file + ":18: machines[2].power: redfish: the machine has no redfish section",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse: want the problem\n  %s\ngot\n%v", want, err)
		}
	}
}
