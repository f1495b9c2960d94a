// Package agentproto is the versioned protocol between Shepherd and the
// agent it starts on each machine (cmd/shepherd-agent). PROTOCOL.md, next to
// this file, is the normative description; this package is its only
// implementation, used by both sides so that they cannot drift apart.
//
// The protocol has three messages:
//
//   - Init, one JSON line that Shepherd (AgentStart, over SSH) writes on the
//     agent's stdin: which machine it runs on, where to send heartbeats, which
//     CA to trust for that, how often.
//   - Answer, one JSON line the agent writes on its stdout: its ed25519 public
//     key and the Init it understood, echoed so that Shepherd knows the agent
//     runs with the parameters it was given (and not, say, a stale agent's).
//   - Heartbeat, a JSON body POSTed to the heartbeat URL every interval,
//     signed with the agent's key, so that only the agent AgentStart recorded
//     can keep a machine out of Recovery.
//
// Every decoder is strict: a size limit checked before parsing, exactly one
// JSON object, no unknown, duplicate or differently-cased keys, every
// required field present and valid. The heartbeat decoder faces the network,
// and the others parse what crossed an SSH session; a lenient parser would
// let two implementations disagree about what a message says. Every decode
// error wraps ErrInvalid (and ErrUnsupportedVersion for a version this
// package does not speak), and names the offending field.
package agentproto

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Version is the version of the Init and Answer messages, carried by
// each. Any change to a message's fields, their encoding or the signed
// bytes of a heartbeat makes a new version of that message: the decoders
// reject unknown fields, so even an added optional field would break an
// older peer.
const Version = 1

// HeartbeatVersion is the version of the heartbeats this package sends:
// version 2 adds the boot identity and the agent's build digest to the
// signed bytes, so that Shepherd can tell a rebooted machine from one
// whose agent was merely restarted. Decoders still accept version 1, the
// heartbeats of agents built before it (HeartbeatV1).
const HeartbeatVersion = 2

// HeartbeatV1 is the version of heartbeats without a boot identity.
const HeartbeatV1 = 1

// Size limits, checked before any parsing. They bound what a peer (or
// anyone who can reach the heartbeat endpoint) can make the other side
// allocate.
const (
	// MaxInitSize bounds an Init line. Most of it is room for a CA bundle.
	MaxInitSize = 64 << 10
	// MaxAnswerSize bounds an Answer line: an echoed Init plus the key.
	MaxAnswerSize = MaxInitSize + 1<<10
	// MaxHeartbeatSize bounds a heartbeat body. A valid one is about 250
	// bytes.
	MaxHeartbeatSize = 1 << 10
)

var (
	// ErrInvalid is wrapped by every error of a decoder or encoder about the
	// message itself (as opposed to I/O errors).
	ErrInvalid = errors.New("invalid agent protocol message")
	// ErrUnsupportedVersion is wrapped (together with ErrInvalid) when a
	// message carries a version other than Version.
	ErrUnsupportedVersion = errors.New("unsupported agent protocol version")
)

// invalidf returns an error wrapping ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// shape describes the keys a JSON object may have. A key mapped to nil
// holds any value (its type is checked by encoding/json); a key mapped to a
// shape holds an object of that shape.
type shape map[string]shape

// encodeLimited encodes v, a message of kind what, as one line of JSON,
// and refuses the result above limit bytes: the peer's decodeStrict would
// refuse it, and the sender's error names the cause.
func encodeLimited(v any, limit int, what string) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", what, err)
	}
	if len(b) > limit {
		return nil, invalidf("%s is %d bytes encoded, more than the limit of %d", what, len(b), limit)
	}
	return b, nil
}

// decodeStrict decodes data, a message of kind what, into v after checking
// it against s. encoding/json alone is not strict enough: it matches keys
// case-insensitively, lets a duplicate key silently override the first, and
// accepts invalid UTF-8. Two parsers could then read one message
// differently, which for a signed message is a classic way in.
func decodeStrict(data []byte, limit int, what string, s shape, v any) error {
	return decodeStrictVersions(data, limit, what, s, v, Version, Version)
}

// decodeStrictVersions is decodeStrict for a message whose versions from
// oldest to newest are accepted.
func decodeStrictVersions(data []byte, limit int, what string, s shape, v any, oldest, newest int) error {
	if len(data) > limit {
		return invalidf("%s is %d bytes, more than the limit of %d", what, len(data), limit)
	}
	if !utf8.Valid(data) {
		return invalidf("%s is not valid UTF-8", what)
	}
	if err := checkVersion(data, what, oldest, newest); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := checkShape(dec, s, what); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalidf("%s: data after the JSON object", what)
	}
	dec = json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalidf("%s: %v", what, err)
	}
	return nil
}

// checkVersion rejects a message of another protocol version before the
// strict checks, so that a peer speaking a newer version learns that
// rather than "unknown field".
func checkVersion(data []byte, what string, oldest, newest int) error {
	var probe struct {
		Version json.RawMessage `json:"version"`
	}
	if json.Unmarshal(data, &probe) != nil || probe.Version == nil {
		return nil // the strict pass reports it
	}
	var v int
	if json.Unmarshal(probe.Version, &v) != nil {
		return invalidf("%s: version %s is not an integer", what, probe.Version)
	}
	switch {
	case v >= oldest && v <= newest:
	case oldest == newest:
		return fmt.Errorf("%w: %w: %s has version %d, this implementation speaks version %d", ErrInvalid, ErrUnsupportedVersion, what, v, newest)
	default:
		return fmt.Errorf("%w: %w: %s has version %d, this implementation speaks versions %d to %d", ErrInvalid, ErrUnsupportedVersion, what, v, oldest, newest)
	}
	return nil
}

// checkShape reads one JSON object from dec and checks its keys against s:
// each known, with exactly that spelling, at most once.
func checkShape(dec *json.Decoder, s shape, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return invalidf("%s: %v", path, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return invalidf("%s is not a JSON object", path)
	}
	seen := make(map[string]bool, len(s))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalidf("%s: %v", path, err)
		}
		key, ok := tok.(string)
		if !ok {
			return invalidf("%s: malformed object", path)
		}
		sub, known := s[key]
		if !known {
			return invalidf("%s: unknown field %q", path, key)
		}
		if seen[key] {
			return invalidf("%s: duplicate field %q", path, key)
		}
		seen[key] = true
		if sub != nil {
			if err := checkShape(dec, sub, path+"."+key); err != nil {
				return err
			}
			continue
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return invalidf("%s.%s: %v", path, key, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return invalidf("%s: %v", path, err)
	}
	return nil
}

// decodeBase64 decodes s, standard base64 with padding, into exactly n
// bytes. Only the canonical encoding is accepted: StdEncoding by itself
// skips newlines and ignores trailing bits.
func decodeBase64(s string, n int, field string) ([]byte, error) {
	if s == "" {
		return nil, invalidf("%s is missing", field)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || base64.StdEncoding.EncodeToString(b) != s {
		return nil, invalidf("%s is not canonical standard base64", field)
	}
	if len(b) != n {
		return nil, invalidf("%s is %d bytes, want %d", field, len(b), n)
	}
	return b, nil
}

// readLine reads one line of at most limit bytes (without its line end)
// from r. It may read past the line: callers hand it a stream whose rest
// they do not need.
func readLine(r io.Reader, limit int, what string) ([]byte, error) {
	br := bufio.NewReader(io.LimitReader(r, int64(limit)+2))
	line, err := br.ReadBytes('\n')
	switch {
	case err == io.EOF && len(line) == 0:
		return nil, fmt.Errorf("reading %s: no data before end of input", what)
	case err != nil && err != io.EOF:
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) > limit {
		return nil, invalidf("%s is longer than the limit of %d bytes", what, limit)
	}
	return line, nil
}
