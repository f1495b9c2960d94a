package bmccred

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Parse takes both formats, refuses the rest without quoting it, and
// credentials never print their password.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in         string
		user, pass string
		err        string
	}{
		{in: "admin:pa:ss\n", user: "admin", pass: "pa:ss"},
		{in: "admin: spaced pass \r\n", user: "admin", pass: " spaced pass "},
		{in: `{"username": "root", "password": "calvin"}`, user: "root", pass: "calvin"},
		{in: "", err: "empty"},
		{in: "adminonly", err: "no colon"},
		{in: ":pw", err: "empty username"},
		{in: "admin:", err: "empty password"},
		{in: "a:b\nc:d\n", err: "more than one line"},
		{in: `{"username": "root"}`, err: "lacks"},
		{in: `{"username": "root", "password": "x", "extra": 1}`, err: "unknown fields"},
		{in: `{"username": "root", "password": "secretvalue"`, err: "not a valid JSON"},
	} {
		c, err := Parse([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, %v; want error containing %q", tc.in, c, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "secretvalue") {
				t.Errorf("Parse(%q) error quotes the input: %v", tc.in, err)
			}
			continue
		}
		if err != nil || c.Username != tc.user || c.Password != tc.pass {
			t.Errorf("Parse(%q) = %q/%q, %v; want %q/%q", tc.in, c.Username, c.Password, err, tc.user, tc.pass)
		}
	}
	c := Credentials{Username: "u", Password: "topsecret"}
	for _, s := range []string{c.String(), c.GoString()} {
		if strings.Contains(s, "topsecret") {
			t.Errorf("Credentials print their password: %s", s)
		}
	}
}

// A credentials file that group or others may read is refused, as OpenSSH
// refuses such a private key.
func TestCredentialsReadableByOthersRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "creds")
	if err := os.WriteFile(p, []byte("admin:pw-hunter2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Read(p)
	if err == nil || !strings.Contains(err.Error(), "accessible by others (mode 0644)") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("Read of a 0644 file: %v, want a refusal naming the mode (and not the password)", err)
	}
}
