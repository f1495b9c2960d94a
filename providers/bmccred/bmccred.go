// Package bmccred reads the credentials of a BMC account, for the
// providers that reach BMCs: Redfish (package redfish) and IPMI (package
// ipmi) take them from the same kind of file, named by the inventory and
// read afresh at each use, so that rotating a password needs no reload.
package bmccred

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/shepherd-fleet/shepherd/internal/secretfile"
)

// maxCredentialsSize bounds a credentials file: anything larger is not one.
const maxCredentialsSize = 64 << 10

// Credentials are a BMC account's user name and password. They come from a
// file (see Read), never from flags, and are never logged: String and the
// error messages of this package leave the password out.
type Credentials struct {
	Username string
	Password string
}

// String names the user and hides the password, so that printing
// credentials by mistake leaks nothing.
func (c Credentials) String() string {
	return fmt.Sprintf("BMC credentials for user %q (password hidden)", c.Username)
}

// GoString is String, for %#v.
func (c Credentials) GoString() string { return c.String() }

// Read reads a credentials file. Two formats are accepted:
//
//   - one line "username:password" (a trailing newline is ignored; the
//     password is everything after the first colon and may contain colons);
//   - a JSON object {"username": "...", "password": "..."}.
//
// Errors name the file and what is wrong with it, never its content.
func Read(path string) (Credentials, error) {
	// Readable by others, the BMC's password would be anyone's on this
	// machine: refused, as OpenSSH refuses such a private key.
	data, err := secretfile.Read(path, maxCredentialsSize)
	if err != nil {
		return Credentials{}, fmt.Errorf("reading BMC credentials: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Credentials{}, fmt.Errorf("BMC credentials file %s: %w", path, err)
	}
	return c, nil
}

// Parse parses the content of a credentials file; see Read for the
// formats. Its errors never quote data.
func Parse(data []byte) (Credentials, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return Credentials{}, errors.New("empty; want username:password or {\"username\": ..., \"password\": ...}")
	}
	var c Credentials
	if trimmed[0] == '{' {
		var j struct {
			Username *string `json:"username"`
			Password *string `json:"password"`
		}
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			// json's messages may quote the offending input: keep only
			// their position-free gist.
			return Credentials{}, errors.New(`not a valid JSON object {"username": "...", "password": "..."} (unknown fields are rejected)`)
		}
		if dec.More() {
			return Credentials{}, errors.New("trailing data after the JSON object")
		}
		if j.Username == nil || j.Password == nil {
			return Credentials{}, errors.New(`JSON object lacks "username" or "password"`)
		}
		c = Credentials{Username: *j.Username, Password: *j.Password}
	} else {
		// Only the line ending is stripped: spaces may belong to a password.
		text := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
		if strings.ContainsAny(text, "\r\n") {
			return Credentials{}, errors.New("more than one line; want a single username:password line")
		}
		user, pass, ok := strings.Cut(text, ":")
		if !ok {
			return Credentials{}, errors.New("no colon; want username:password")
		}
		c = Credentials{Username: user, Password: pass}
	}
	switch {
	case c.Username == "":
		return Credentials{}, errors.New("empty username")
	case strings.ContainsAny(c.Username, ":\r\n") || strings.ContainsFunc(c.Username, isControl):
		return Credentials{}, errors.New("the username contains a colon or control characters")
	case c.Password == "":
		return Credentials{}, errors.New("empty password")
	case strings.ContainsFunc(c.Password, isControl):
		return Credentials{}, errors.New("the password contains control characters")
	}
	return c, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
