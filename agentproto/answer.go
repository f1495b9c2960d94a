package agentproto

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"io"
)

// Answer is the agent's reply to an Init, one line on its stdout.
type Answer struct {
	// PublicKey is the agent's ed25519 key, which signs its heartbeats.
	// Shepherd records it in machine_agent_started.
	PublicKey ed25519.PublicKey
	// Init is the Init message as the agent understood it.
	Init Init
}

type answerWire struct {
	Version   int       `json:"version"`
	PublicKey string    `json:"public_key"`
	Init      *initWire `json:"init"`
}

var answerShape = shape{
	"version":    nil,
	"public_key": nil,
	"init":       initShape,
}

// EncodeAnswer returns a as one line of JSON, without the line end.
func EncodeAnswer(a Answer) ([]byte, error) {
	if len(a.PublicKey) != ed25519.PublicKeySize {
		return nil, invalidf("answer: public key is %d bytes, want %d", len(a.PublicKey), ed25519.PublicKeySize)
	}
	if err := a.Init.Validate(); err != nil {
		return nil, fmt.Errorf("answer: %w", err)
	}
	init := a.Init.wire()
	return encodeLimited(answerWire{
		Version:   Version,
		PublicKey: base64.StdEncoding.EncodeToString(a.PublicKey),
		Init:      &init,
	}, MaxAnswerSize, "answer")
}

// DecodeAnswer parses an Answer (surrounding whitespace, such as the line
// end, is allowed). It does not compare the echo with what was sent: see
// CheckEcho.
func DecodeAnswer(data []byte) (Answer, error) {
	var w answerWire
	if err := decodeStrict(data, MaxAnswerSize, "answer", answerShape, &w); err != nil {
		return Answer{}, err
	}
	if w.Version == 0 {
		return Answer{}, invalidf("answer: version is missing")
	}
	key, err := decodeBase64(w.PublicKey, ed25519.PublicKeySize, "answer: public_key")
	if err != nil {
		return Answer{}, err
	}
	if w.Init == nil {
		return Answer{}, invalidf("answer: init is missing")
	}
	init, err := w.Init.init("answer.init")
	if err != nil {
		return Answer{}, err
	}
	return Answer{PublicKey: ed25519.PublicKey(key), Init: init}, nil
}

// ReadAnswer reads one line from r, at most MaxAnswerSize bytes, and decodes
// it as an Answer. It may consume r beyond the line.
func ReadAnswer(r io.Reader) (Answer, error) {
	line, err := readLine(r, MaxAnswerSize, "answer")
	if err != nil {
		return Answer{}, err
	}
	return DecodeAnswer(line)
}

// CheckEcho returns an error naming the first field in which the echoed
// Init differs from sent. A difference means the agent did not get (or did
// not understand) this Init: for example an older agent answering for
// another machine, or a transport that mangled the message.
func (a Answer) CheckEcho(sent Init) error {
	got := a.Init
	switch {
	case got.MachineID != sent.MachineID:
		return invalidf("answer echoes machine_id %s, sent %s", got.MachineID, sent.MachineID)
	case got.HeartbeatURL != sent.HeartbeatURL:
		return invalidf("answer echoes heartbeat_url %q, sent %q", truncate(got.HeartbeatURL), truncate(sent.HeartbeatURL))
	case got.CACertPEM != sent.CACertPEM:
		return invalidf("answer echoes a different ca_cert_pem than sent")
	case got.HeartbeatInterval != sent.HeartbeatInterval:
		return invalidf("answer echoes heartbeat_interval %s, sent %s", got.HeartbeatInterval, sent.HeartbeatInterval)
	}
	return nil
}
