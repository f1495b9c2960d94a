package static

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the inventory parser: it must never
// panic, and it must either return an inventory whose machines all have an
// id and an SSH address, or an *Error naming at least one problem with the
// file's name.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"",
		"machines: []\n",
		"- id: a\n  ssh: {address: 127.0.0.1, user: root}\n",
		"machines:\n  - id: node1\n    location: r1\n    ssh:\n      address: 10.0.0.1\n      port: 22\n      user: root\n",
		"machines:\n  - id: node1\n    ssh: {address: 10.0.0.1}\n  - id: node1\n    ssh: {address: 10.0.0.2}\n",
		"machines:\n  - id: x\n    ssh: {address: '::1', port: 70000}\n",
		"defaults: {ssh: {user: root, port: 2222}}\nmachines:\n  - id: a\n    ssh: {address: h1}\n",
		"[{\"id\": \"a\", \"ssh\": {\"address\": \"h\"}}]",
		"machines:\n  - id: a\n    bogus: 1\n",
		"machines: &a [*a]\n",
		"machines:\n  - id: a\n    redfish: {endpoint: 'http://[::1'}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		inv, err := Parse("inventory.yaml", data)
		if err != nil {
			var perr *Error
			if errors.As(err, &perr) && len(perr.Problems) == 0 {
				t.Fatalf("inventory error without problems: %v", err)
			}
			if !strings.Contains(err.Error(), "inventory.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if inv == nil {
			t.Fatal("nil inventory without an error")
		}
		for _, m := range inv.Machines {
			if m.ID == "" || m.SSH.Host == "" {
				t.Fatalf("accepted a machine without id or SSH host: %+v", m)
			}
			if got, ok := inv.Machine(m.ID); !ok || got.ID != m.ID {
				t.Fatalf("machine %q not found by its id", m.ID)
			}
		}
	})
}
