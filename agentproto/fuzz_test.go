package agentproto

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The fuzz targets check what the decoders promise: they never panic, every
// error wraps ErrInvalid, and whatever they accept re-encodes to a message
// they decode to the same value. `go test` runs them on the committed seed
// corpus in testdata/fuzz; `go test -fuzz=FuzzDecodeHeartbeat` explores.

func FuzzDecodeInit(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := DecodeInit(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		enc, err := EncodeInit(in)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", data, err)
		}
		again, err := DecodeInit(enc)
		if err != nil || again != in {
			t.Fatalf("re-encoded %q decodes to %+v, %v; want %+v", enc, again, err, in)
		}
	})
}

func FuzzDecodeAnswer(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := DecodeAnswer(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := a.CheckEcho(a.Init); err != nil {
			t.Fatalf("answer does not match its own echo: %v", err)
		}
		enc, err := EncodeAnswer(a)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", data, err)
		}
		again, err := DecodeAnswer(enc)
		if err != nil || again.Init != a.Init || !again.PublicKey.Equal(a.PublicKey) {
			t.Fatalf("re-encoded %q decodes to %+v, %v; want %+v", enc, again, err, a)
		}
	})
}

func FuzzDecodeHeartbeat(f *testing.F) {
	pub := vectorKey().Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHeartbeat(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		// Verification of arbitrary input must not panic either.
		verr := h.Verify(pub)
		enc, err := EncodeHeartbeat(h)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", data, err)
		}
		if len(enc) > MaxHeartbeatSize {
			t.Fatalf("re-encoded heartbeat is %d bytes", len(enc))
		}
		again, err := DecodeHeartbeat(enc)
		if err != nil {
			t.Fatalf("re-encoded %q: %v", enc, err)
		}
		if !bytes.Equal(again.SignedBytes(), h.SignedBytes()) || !bytes.Equal(again.Signature, h.Signature) {
			t.Fatalf("re-encoded %q decodes to %+v, want %+v", enc, again, h)
		}
		if (again.Verify(pub) == nil) != (verr == nil) {
			t.Fatalf("verification changed by re-encoding %q", data)
		}
	})
}

var updateSeeds = flag.Bool("update_seeds", false, "rewrite the committed fuzz seed corpus in testdata/fuzz")

// TestWriteSeedCorpus regenerates testdata/fuzz with -update_seeds: valid
// messages of every kind (so that the fuzzer starts from deep inside the
// decoders) and near misses of each check.
func TestWriteSeedCorpus(t *testing.T) {
	if !*updateSeeds {
		t.Skip("run with -update_seeds to rewrite testdata/fuzz")
	}
	in := testInit(t)
	init, err := EncodeInit(in)
	if err != nil {
		t.Fatal(err)
	}
	minimal, err := EncodeInit(Init{MachineID: testMachine, HeartbeatURL: "http://10.1.2.3:8080/agent/v1/heartbeat"})
	if err != nil {
		t.Fatal(err)
	}
	key := vectorKey()
	answer, err := EncodeAnswer(Answer{PublicKey: key.Public().(ed25519.PublicKey), Init: in})
	if err != nil {
		t.Fatal(err)
	}
	minimalAnswer, err := EncodeAnswer(Answer{PublicKey: key.Public().(ed25519.PublicKey), Init: Init{MachineID: testMachine, HeartbeatURL: "http://h/"}})
	if err != nil {
		t.Fatal(err)
	}
	heartbeat := signedHeartbeat(t)
	seeds := map[string]map[string]string{
		"FuzzDecodeInit": {
			"valid":           string(init),
			"valid_minimal":   string(minimal) + "\n",
			"unknown_field":   `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/","x":1}`,
			"duplicate_field": `{"version":1,"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/"}`,
			"version_2":       `{"version":2,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/"}`,
			"bad_interval":    `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/","heartbeat_interval":"1ns"}`,
			"bad_ca":          `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/","ca_cert_pem":"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}`,
			"empty":           ``,
		},
		"FuzzDecodeAnswer": {
			"valid":         string(answer),
			"valid_minimal": string(minimalAnswer) + "\n",
			"nested_extra":  `{"version":1,"public_key":"ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ=","init":{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/","x":[]}}`,
			"short_key":     `{"version":1,"public_key":"AAAA","init":{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/"}}`,
		},
		"FuzzDecodeHeartbeat": {
			"valid":           string(heartbeat),
			"offset":          `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","timestamp":"2025-01-02T05:04:05.123456789+02:00","nonce":"AAAAAAAAAAAAAAAAAAAAAA==","signature":"9mYD1SmMFtjoUmzj6Q917RUYyg4FjMqVo1IVAIf8ECeAa2/M5tZVWdyuOivzFhvBExgoyhgP1XxYAV1FC1QLDw=="}`,
			"duplicate_nonce": `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","timestamp":"2025-01-02T03:04:05Z","nonce":"AAAAAAAAAAAAAAAAAAAAAA==","nonce":"AAAAAAAAAAAAAAAAAAAAAA==","signature":""}`,
			"year_2300":       `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","timestamp":"2300-01-01T00:00:00Z","nonce":"AAAAAAAAAAAAAAAAAAAAAA==","signature":"9mYD1SmMFtjoUmzj6Q917RUYyg4FjMqVo1IVAIf8ECeAa2/M5tZVWdyuOivzFhvBExgoyhgP1XxYAV1FC1QLDw=="}`,
			"not_object":      `"heartbeat"`,
		},
	}
	for target, files := range seeds {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range files {
			content := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(data))
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
