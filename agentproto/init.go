package agentproto

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/google/uuid"
)

// Heartbeat interval bounds. The minimum keeps a misconfigured Shepherd from
// making its agents flood it (the endpoint rate-limits per source anyway);
// the maximum keeps an agent useful against Recovery's heartbeat timeout.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	MinHeartbeatInterval     = 100 * time.Millisecond
	MaxHeartbeatInterval     = time.Hour
)

// maxURLLength bounds heartbeat_url.
const maxURLLength = 2048

// Init is the message Shepherd writes, as one line, on the agent's stdin.
type Init struct {
	// MachineID is the BMDB id of the machine the agent runs on; every
	// heartbeat carries it.
	MachineID uuid.UUID
	// HeartbeatURL is where the agent POSTs heartbeats: an http or https
	// URL of Shepherd's heartbeat endpoint, as the machine reaches it.
	HeartbeatURL string
	// CACertPEM, optional, holds the PEM certificates the agent trusts for
	// an https HeartbeatURL instead of the system roots: Shepherd's endpoint
	// usually has a certificate from a private CA.
	CACertPEM string
	// HeartbeatInterval is how often the agent sends a heartbeat; zero
	// means DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
}

// initWire is Init as JSON.
type initWire struct {
	Version           int    `json:"version"`
	MachineID         string `json:"machine_id"`
	HeartbeatURL      string `json:"heartbeat_url"`
	CACertPEM         string `json:"ca_cert_pem,omitempty"`
	HeartbeatInterval string `json:"heartbeat_interval,omitempty"`
}

var initShape = shape{
	"version":            nil,
	"machine_id":         nil,
	"heartbeat_url":      nil,
	"ca_cert_pem":        nil,
	"heartbeat_interval": nil,
}

// Interval returns the heartbeat interval the agent uses: HeartbeatInterval,
// or the default when it is zero.
func (i Init) Interval() time.Duration {
	if i.HeartbeatInterval == 0 {
		return DefaultHeartbeatInterval
	}
	return i.HeartbeatInterval
}

// Validate checks that i can be sent: Shepherd learns of a bad parameter
// when it builds the message, not from an agent's refusal.
func (i Init) Validate() error {
	if i.MachineID == uuid.Nil {
		return invalidf("init: machine_id is missing")
	}
	if err := checkHeartbeatURL(i.HeartbeatURL); err != nil {
		return err
	}
	if i.CACertPEM != "" {
		if _, err := parseCertificates(i.CACertPEM); err != nil {
			return err
		}
	}
	if d := i.HeartbeatInterval; d != 0 && (d < MinHeartbeatInterval || d > MaxHeartbeatInterval) {
		return invalidf("init: heartbeat_interval %s is outside [%s, %s]", d, MinHeartbeatInterval, MaxHeartbeatInterval)
	}
	return nil
}

// CertPool returns the pool of CACertPEM, or nil (meaning the system roots)
// when there is none.
func (i Init) CertPool() (*x509.CertPool, error) {
	if i.CACertPEM == "" {
		return nil, nil
	}
	certs, err := parseCertificates(i.CACertPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

func (i Init) wire() initWire {
	w := initWire{
		Version:      Version,
		MachineID:    i.MachineID.String(),
		HeartbeatURL: i.HeartbeatURL,
		CACertPEM:    i.CACertPEM,
	}
	if i.HeartbeatInterval != 0 {
		w.HeartbeatInterval = i.HeartbeatInterval.String()
	}
	return w
}

// EncodeInit returns i as one line of JSON, without the line end.
func EncodeInit(i Init) ([]byte, error) {
	if err := i.Validate(); err != nil {
		return nil, err
	}
	return encodeLimited(i.wire(), MaxInitSize, "init")
}

// DecodeInit parses an Init message (surrounding whitespace, such as the
// line end, is allowed).
func DecodeInit(data []byte) (Init, error) {
	var w initWire
	if err := decodeStrict(data, MaxInitSize, "init", initShape, &w); err != nil {
		return Init{}, err
	}
	return w.init("init")
}

// ReadInit reads one line from r, at most MaxInitSize bytes, and decodes it
// as an Init. It may consume r beyond the line.
func ReadInit(r io.Reader) (Init, error) {
	line, err := readLine(r, MaxInitSize, "init")
	if err != nil {
		return Init{}, err
	}
	return DecodeInit(line)
}

// init converts and validates a decoded init; path names it in errors.
func (w initWire) init(path string) (Init, error) {
	if w.Version == 0 {
		return Init{}, invalidf("%s: version is missing", path)
	}
	if w.Version != Version { // a nested init escapes checkVersion
		return Init{}, fmt.Errorf("%w: %w: %s has version %d, this implementation speaks version %d", ErrInvalid, ErrUnsupportedVersion, path, w.Version, Version)
	}
	id, err := parseMachineID(w.MachineID, path)
	if err != nil {
		return Init{}, err
	}
	i := Init{MachineID: id, HeartbeatURL: w.HeartbeatURL, CACertPEM: w.CACertPEM}
	if w.HeartbeatInterval != "" {
		d, err := time.ParseDuration(w.HeartbeatInterval)
		if err != nil {
			return Init{}, invalidf("%s: heartbeat_interval %q is not a duration such as \"5s\"", path, w.HeartbeatInterval)
		}
		if d == 0 {
			return Init{}, invalidf("%s: heartbeat_interval is zero (omit it for the default)", path)
		}
		i.HeartbeatInterval = d
	}
	if err := i.Validate(); err != nil {
		return Init{}, fmt.Errorf("%s: %w", path, err)
	}
	return i, nil
}

// parseMachineID accepts only the canonical lowercase form of a UUID, the
// one Shepherd sends: uuid.Parse would also take braces, URNs and missing
// dashes.
func parseMachineID(s, path string) (uuid.UUID, error) {
	if s == "" {
		return uuid.Nil, invalidf("%s: machine_id is missing", path)
	}
	id, err := uuid.Parse(s)
	if err != nil || id.String() != s {
		return uuid.Nil, invalidf("%s: machine_id %q is not a lowercase canonical UUID", path, truncate(s))
	}
	if id == uuid.Nil {
		return uuid.Nil, invalidf("%s: machine_id is the nil UUID", path)
	}
	return id, nil
}

func checkHeartbeatURL(s string) error {
	if s == "" {
		return invalidf("init: heartbeat_url is missing")
	}
	if len(s) > maxURLLength {
		return invalidf("init: heartbeat_url is longer than %d bytes", maxURLLength)
	}
	u, err := url.Parse(s)
	if err != nil {
		return invalidf("init: heartbeat_url: %v", err)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return invalidf("init: heartbeat_url %q: scheme must be https or http", truncate(s))
	}
	if u.Host == "" || u.Opaque != "" {
		return invalidf("init: heartbeat_url %q has no host", truncate(s))
	}
	if u.User != nil {
		return invalidf("init: heartbeat_url must not carry credentials")
	}
	if u.Fragment != "" {
		return invalidf("init: heartbeat_url %q has a fragment", truncate(s))
	}
	return nil
}

// parseCertificates parses a PEM bundle of certificates, strictly: nothing
// but CERTIFICATE blocks and whitespace. pem.Decode alone would skip any text
// before a block.
func parseCertificates(s string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := []byte(s)
	for {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if len(rest) == 0 {
			break
		}
		if !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			return nil, invalidf("init: ca_cert_pem: text outside PEM blocks")
		}
		block, after := pem.Decode(rest)
		// pem.Decode skips a malformed block and returns the next one: the
		// consumed text must hold exactly one.
		if block == nil || bytes.Count(rest[:len(rest)-len(after)], []byte("-----BEGIN ")) != 1 {
			return nil, invalidf("init: ca_cert_pem: malformed PEM block")
		}
		rest = after
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			return nil, invalidf("init: ca_cert_pem: a %q block, want only CERTIFICATE blocks without headers", truncate(block.Type))
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, invalidf("init: ca_cert_pem: certificate %d: %v", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, invalidf("init: ca_cert_pem holds no certificate")
	}
	return certs, nil
}

// truncate shortens a peer-provided string quoted in an error.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
