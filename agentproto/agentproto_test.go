package agentproto

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// testCA returns a PEM self-signed certificate, deterministic so that the
// seed corpus written from it does not change between runs.
func testCA(t testing.TB) string {
	t.Helper()
	seed := bytes.Repeat([]byte{7}, ed25519.SeedSize)
	key := ed25519.NewKeyFromSeed(seed)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "shepherd test CA"},
		NotBefore:             time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2035, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, key.Public(), key) // ed25519 signing ignores the reader
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

var testMachine = uuid.MustParse("6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10")

func testInit(t testing.TB) Init {
	return Init{
		MachineID:         testMachine,
		HeartbeatURL:      "https://shepherd.example:8443/agent/v1/heartbeat",
		CACertPEM:         testCA(t),
		HeartbeatInterval: 2 * time.Second,
	}
}

func TestInitRoundTrip(t *testing.T) {
	for _, in := range []Init{
		testInit(t),
		{MachineID: testMachine, HeartbeatURL: "http://10.0.0.1:8080/agent/v1/heartbeat"},
	} {
		b, err := EncodeInit(in)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.ContainsRune(b, '\n') {
			t.Fatalf("encoded init is not one line: %s", b)
		}
		out, err := DecodeInit(append(b, '\n'))
		if err != nil {
			t.Fatal(err)
		}
		if out != in {
			t.Fatalf("round trip: got %+v, want %+v", out, in)
		}
		got, err := ReadInit(strings.NewReader(string(b) + "\r\nsomething after"))
		if err != nil || got != in {
			t.Fatalf("ReadInit: %+v, %v", got, err)
		}
	}
	if got := (Init{}).Interval(); got != DefaultHeartbeatInterval {
		t.Errorf("default interval %s", got)
	}
	pool, err := testInit(t).CertPool()
	if err != nil || pool == nil {
		t.Errorf("CertPool: %v, %v", pool, err)
	}
}

// TestDecodeInitStrict lists malformed init messages; each must be refused
// with an error wrapping ErrInvalid that mentions want.
func TestDecodeInitStrict(t *testing.T) {
	const id = `"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10"`
	const u = `"heartbeat_url":"https://h:1/x"`
	ca := testCA(t)
	caJSON := func(pem string) string { return `"ca_cert_pem":` + quote(pem) }
	for _, tc := range []struct{ name, msg, want string }{
		{"empty", ``, "init"},
		{"not object", `[1]`, "not a JSON object"},
		{"unknown field", `{"version":1,` + id + `,` + u + `,"extra":1}`, `unknown field "extra"`},
		{"case variant", `{"version":1,"Machine_ID":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10",` + u + `}`, `unknown field "Machine_ID"`},
		{"duplicate", `{"version":1,` + id + `,` + id + `,` + u + `}`, `duplicate field "machine_id"`},
		{"trailing", `{"version":1,` + id + `,` + u + `} {}`, "data after"},
		{"no version", `{` + id + `,` + u + `}`, "version is missing"},
		{"version 2", `{"version":2,` + id + `,` + u + `,"new":true}`, "speaks version 1"},
		{"version float", `{"version":1.0,` + id + `,` + u + `}`, "not an integer"},
		{"version string", `{"version":"1",` + id + `,` + u + `}`, "not an integer"},
		{"no machine", `{"version":1,` + u + `}`, "machine_id is missing"},
		{"uppercase machine", `{"version":1,"machine_id":"6F0C4D0E-8C1A-4B9E-9A53-2F5B1F3C7D10",` + u + `}`, "canonical"},
		{"urn machine", `{"version":1,"machine_id":"urn:uuid:6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10",` + u + `}`, "canonical"},
		{"nil machine", `{"version":1,"machine_id":"00000000-0000-0000-0000-000000000000",` + u + `}`, "nil UUID"},
		{"no url", `{"version":1,` + id + `}`, "heartbeat_url is missing"},
		{"ftp url", `{"version":1,` + id + `,"heartbeat_url":"ftp://h/x"}`, "scheme"},
		{"relative url", `{"version":1,` + id + `,"heartbeat_url":"/x"}`, "scheme"},
		{"url with password", `{"version":1,` + id + `,"heartbeat_url":"https://a:b@h/x"}`, "credentials"},
		{"null url", `{"version":1,` + id + `,"heartbeat_url":null}`, "heartbeat_url is missing"},
		{"bad interval", `{"version":1,` + id + `,` + u + `,"heartbeat_interval":"5"}`, "not a duration"},
		{"zero interval", `{"version":1,` + id + `,` + u + `,"heartbeat_interval":"0s"}`, "zero"},
		{"tiny interval", `{"version":1,` + id + `,` + u + `,"heartbeat_interval":"1ms"}`, "outside"},
		{"negative interval", `{"version":1,` + id + `,` + u + `,"heartbeat_interval":"-5s"}`, "outside"},
		{"interval as number", `{"version":1,` + id + `,` + u + `,"heartbeat_interval":5}`, "cannot unmarshal"},
		{"ca garbage", `{"version":1,` + id + `,` + u + `,` + caJSON("hello") + `}`, "outside PEM"},
		{"ca text before", `{"version":1,` + id + `,` + u + `,` + caJSON("junk\n"+ca) + `}`, "outside PEM"},
		{"ca text after", `{"version":1,` + id + `,` + u + `,` + caJSON(ca+"junk") + `}`, "outside PEM"},
		{"ca key block", `{"version":1,` + id + `,` + u + `,` + caJSON("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n") + `}`, "PRIVATE KEY"},
		{"ca skipped block", `{"version":1,` + id + `,` + u + `,` + caJSON("-----BEGIN CERTIFICATE-----\n!!\n"+ca) + `}`, "malformed"},
		{"invalid utf8", "{\"version\":1," + id + ",\"heartbeat_url\":\"https://h/\xff\"}", "UTF-8"},
		{"too large", `{"version":1,` + id + `,` + u + `,"ca_cert_pem":"` + strings.Repeat("A", MaxInitSize) + `"}`, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeInit([]byte(tc.msg))
			if err == nil {
				t.Fatalf("accepted %s", tc.msg)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
	_, err := DecodeInit([]byte(`{"version":2}`))
	if !errors.Is(err, ErrUnsupportedVersion) {
		t.Errorf("version 2: %v, want ErrUnsupportedVersion", err)
	}
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '\n':
			b.WriteString(`\n`)
		case '"':
			b.WriteString(`\"`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func TestEncodeInitRefusesInvalid(t *testing.T) {
	for _, in := range []Init{
		{},
		{MachineID: testMachine},
		{MachineID: testMachine, HeartbeatURL: "https://h/", HeartbeatInterval: time.Millisecond},
		{MachineID: testMachine, HeartbeatURL: "https://h/", CACertPEM: "x"},
	} {
		if _, err := EncodeInit(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("EncodeInit(%+v): %v, want ErrInvalid", in, err)
		}
	}
}

func TestReadInitLimits(t *testing.T) {
	if _, err := ReadInit(strings.NewReader("")); err == nil || !strings.Contains(err.Error(), "no data") {
		t.Errorf("empty stdin: %v", err)
	}
	long := strings.Repeat("x", MaxInitSize+10) + "\n"
	if _, err := ReadInit(strings.NewReader(long)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("long line: %v", err)
	}
}

func TestAnswer(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sent := testInit(t)
	b, err := EncodeAnswer(Answer{PublicKey: pub, Init: sent})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ReadAnswer(bytes.NewReader(append(b, '\n')))
	if err != nil {
		t.Fatal(err)
	}
	if !a.PublicKey.Equal(pub) || a.Init != sent {
		t.Fatalf("round trip: %+v", a)
	}
	if err := a.CheckEcho(sent); err != nil {
		t.Fatal(err)
	}
	other := sent
	other.MachineID = uuid.New()
	if err := a.CheckEcho(other); err == nil || !strings.Contains(err.Error(), "machine_id") {
		t.Errorf("CheckEcho with another machine: %v", err)
	}
	other = sent
	other.HeartbeatInterval = 0
	if err := a.CheckEcho(other); err == nil || !strings.Contains(err.Error(), "heartbeat_interval") {
		t.Errorf("CheckEcho with another interval: %v", err)
	}

	key := base64.StdEncoding.EncodeToString(pub)
	init, _ := EncodeInit(Init{MachineID: testMachine, HeartbeatURL: "https://h/"})
	for _, tc := range []struct{ name, msg, want string }{
		{"no init", `{"version":1,"public_key":"` + key + `"}`, "init is missing"},
		{"no key", `{"version":1,"init":` + string(init) + `}`, "public_key is missing"},
		{"short key", `{"version":1,"public_key":"AAAA","init":` + string(init) + `}`, "want 32"},
		{"key with newline", `{"version":1,"public_key":"` + key[:10] + `\n` + key[10:] + `","init":` + string(init) + `}`, "canonical"},
		{"unknown nested", `{"version":1,"public_key":"` + key + `","init":{"version":1,"x":1}}`, `answer.init: unknown field "x"`},
		{"duplicate nested", `{"version":1,"public_key":"` + key + `","init":{"version":1,"version":1}}`, `duplicate field "version"`},
		{"nested version 2", `{"version":1,"public_key":"` + key + `","init":{"version":2,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","heartbeat_url":"https://h/"}}`, "answer.init has version 2"},
		{"init null", `{"version":1,"public_key":"` + key + `","init":null}`, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeAnswer([]byte(tc.msg))
			if err == nil {
				t.Fatalf("accepted %s", tc.msg)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// The test vector of PROTOCOL.md: another implementation must produce
// exactly these bytes and this signature.
const (
	vectorPublicKey   = "ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ="
	vectorSignedBytes = "73686570686572642d6865617274626561742d763100000000016f0c4d0e8c1a4b9e9a532f5b1f3c7d101816c11ef64eff15000102030405060708090a0b0c0d0e0f"
	vectorBody        = `{"version":1,"machine_id":"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10","timestamp":"2025-01-02T03:04:05.123456789Z","nonce":"AAECAwQFBgcICQoLDA0ODw==","signature":"9mYD1SmMFtjoUmzj6Q917RUYyg4FjMqVo1IVAIf8ECeAa2/M5tZVWdyuOivzFhvBExgoyhgP1XxYAV1FC1QLDw=="}`
)

func vectorKey() ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i + 1)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// signedHeartbeat is a heartbeat of testMachine signed with vectorKey and
// encoded, as an agent sends it: a valid line that tests vary.
func signedHeartbeat(t testing.TB) []byte {
	t.Helper()
	return signed(t, Heartbeat{MachineID: testMachine, Timestamp: time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC)})
}

// signed is hb signed with vectorKey and encoded.
func signed(t testing.TB, hb Heartbeat) []byte {
	t.Helper()
	if err := hb.Sign(vectorKey()); err != nil {
		t.Fatal(err)
	}
	enc, err := EncodeHeartbeat(hb)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// checkVector signs h with the vector key and nonce 0, 1, 2, ..., checks
// its signed bytes and body against the vector's, and returns the body
// decoded and verified.
func checkVector(t *testing.T, h Heartbeat, wantSigned, wantBody string) Heartbeat {
	t.Helper()
	key := vectorKey()
	for i := range h.Nonce {
		h.Nonce[i] = byte(i)
	}
	if err := h.Sign(key); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.SignedBytes()); got != wantSigned {
		t.Fatalf("signed bytes\n got %s\nwant %s", got, wantSigned)
	}
	body, err := EncodeHeartbeat(h)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != wantBody {
		t.Fatalf("body\n got %s\nwant %s", body, wantBody)
	}
	d, err := DecodeHeartbeat(body)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(key.Public().(ed25519.PublicKey)); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestHeartbeatVector(t *testing.T) {
	pub := vectorKey().Public().(ed25519.PublicKey)
	if got := base64.StdEncoding.EncodeToString(pub); got != vectorPublicKey {
		t.Fatalf("public key %s", got)
	}
	ts := time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC)
	checkVector(t, Heartbeat{MachineID: testMachine, Timestamp: ts}, vectorSignedBytes, vectorBody)
	// The same instant in another offset is the same heartbeat.
	shifted := strings.Replace(vectorBody, "2025-01-02T03:04:05.123456789Z", "2025-01-02T05:04:05.123456789+02:00", 1)
	d, err := DecodeHeartbeat([]byte(shifted))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(pub); err != nil {
		t.Fatal(err)
	}
}

func TestHeartbeatVerify(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	h, err := NewHeartbeat(testMachine, now, testBoot, testDigest, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Verify(pub); err != nil {
		t.Fatal(err)
	}
	if err := h.Verify(otherPub); !errors.Is(err, ErrBadSignature) {
		t.Errorf("other key: %v", err)
	}
	if err := h.Verify(pub[:31]); err == nil {
		t.Error("short key accepted")
	}
	// Every signed field is covered.
	for name, mutate := range map[string]func(*Heartbeat){
		"machine":   func(h *Heartbeat) { h.MachineID = uuid.New() },
		"timestamp": func(h *Heartbeat) { h.Timestamp = h.Timestamp.Add(time.Nanosecond) },
		"nonce":     func(h *Heartbeat) { h.Nonce[3] ^= 1 },
		"signature": func(h *Heartbeat) { h.Signature = append([]byte(nil), h.Signature...); h.Signature[0] ^= 1 },
		"no sig":    func(h *Heartbeat) { h.Signature = nil },
	} {
		m := h
		mutate(&m)
		if err := m.Verify(pub); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s changed: %v, want ErrBadSignature", name, err)
		}
	}
	h2, _ := NewHeartbeat(testMachine, now, testBoot, testDigest, key)
	if h2.Nonce == h.Nonce {
		t.Error("nonce repeated")
	}
	if _, err := NewHeartbeat(testMachine, time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), testBoot, testDigest, key); err == nil {
		t.Error("timestamp before 1970 signed")
	}
}

func TestDecodeHeartbeatStrict(t *testing.T) {
	good := map[string]string{
		"version":    `1`,
		"machine_id": `"6f0c4d0e-8c1a-4b9e-9a53-2f5b1f3c7d10"`,
		"timestamp":  `"2025-01-02T03:04:05.123456789Z"`,
		"nonce":      `"AAECAwQFBgcICQoLDA0ODw=="`,
		"signature":  `"9mYD1SmMFtjoUmzj6Q917RUYyg4FjMqVo1IVAIf8ECeAa2/M5tZVWdyuOivzFhvBExgoyhgP1XxYAV1FC1QLDw=="`,
	}
	build := func(change map[string]string) string {
		var parts []string
		for _, k := range []string{"version", "machine_id", "timestamp", "nonce", "signature"} {
			v, ok := change[k]
			if !ok {
				v = good[k]
			}
			if v != "-" {
				parts = append(parts, `"`+k+`":`+v)
			}
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	if _, err := DecodeHeartbeat([]byte(build(nil))); err != nil {
		t.Fatalf("good heartbeat refused: %v", err)
	}
	for _, tc := range []struct{ name, msg, want string }{
		{"no version", build(map[string]string{"version": "-"}), "version is missing"},
		{"version 3", build(map[string]string{"version": "3"}), "version 3"},
		{"no machine", build(map[string]string{"machine_id": "-"}), "machine_id is missing"},
		{"no timestamp", build(map[string]string{"timestamp": "-"}), "timestamp is missing"},
		{"unix timestamp", build(map[string]string{"timestamp": `1735787045`}), "cannot unmarshal"},
		{"bad timestamp", build(map[string]string{"timestamp": `"yesterday"`}), "RFC 3339"},
		{"1960", build(map[string]string{"timestamp": `"1960-01-01T00:00:00Z"`}), "outside 1970"},
		{"2300", build(map[string]string{"timestamp": `"2300-01-01T00:00:00Z"`}), "outside 1970"},
		{"no nonce", build(map[string]string{"nonce": "-"}), "nonce is missing"},
		{"short nonce", build(map[string]string{"nonce": `"AAECAwQFBgcICQoLDA0O"`}), "want 16"},
		{"unpadded nonce", build(map[string]string{"nonce": `"AAECAwQFBgcICQoLDA0ODw"`}), "canonical"},
		{"no signature", build(map[string]string{"signature": "-"}), "signature is missing"},
		{"url-safe signature", build(map[string]string{"signature": `"9mYD1SmMFtjoUmzj6Q917RUYyg4FjMqVo1IVAIf8ECeAa2_M5tZVWdyuOivzFhvBExgoyhgP1XxYAV1FC1QLDw=="`}), "canonical"},
		{"extra", strings.TrimSuffix(build(nil), "}") + `,"x":1}`, `unknown field "x"`},
		{"duplicate", strings.TrimSuffix(build(nil), "}") + `,"nonce":"AAECAwQFBgcICQoLDA0ODw=="}`, `duplicate field "nonce"`},
		{"array", `[` + build(nil) + `]`, "not a JSON object"},
		{"two objects", build(nil) + build(nil), "data after"},
		{"too large", build(nil) + strings.Repeat(" ", MaxHeartbeatSize), "limit"},
		{"truncated", build(nil)[:40], "heartbeat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeHeartbeat([]byte(tc.msg))
			if err == nil {
				t.Fatalf("accepted %s", tc.msg)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// A batch says of each heartbeat what Verify says, whatever else is in the
// batch: forgeries, a key or signature of the wrong size, another agent's
// signature, at every batch size the endpoint uses.
func TestBatchVerifierAgreesWithVerify(t *testing.T) {
	const agents = 8
	pubs := make([]ed25519.PublicKey, agents)
	keys := make([]ed25519.PrivateKey, agents)
	for i := range agents {
		pubs[i], keys[i], _ = ed25519.GenerateKey(rand.Reader)
	}
	now := time.Now()
	b := NewBatchVerifier()
	for _, size := range []int{1, 2, 7, 16, 64} {
		for _, forged := range []bool{false, true} {
			hbs := make([]Heartbeat, size)
			hbKeys := make([]ed25519.PublicKey, size)
			for i := range size {
				h, err := NewHeartbeat(uuid.New(), now, testBoot, testDigest, keys[i%agents])
				if err != nil {
					t.Fatal(err)
				}
				hbs[i], hbKeys[i] = h, pubs[i%agents]
				if !forged || i%3 != 0 {
					continue
				}
				switch i % 4 {
				case 0:
					hbs[i].Signature[5] ^= 0x40
				case 1:
					hbKeys[i] = pubs[(i+1)%agents]
				case 2:
					hbKeys[i] = hbKeys[i][:31]
				case 3:
					hbs[i].Signature = hbs[i].Signature[:63]
				}
			}
			valid := make([]bool, size)
			b.Verify(hbs, hbKeys, valid)
			for i := range size {
				want := hbs[i].Verify(hbKeys[i]) == nil
				if valid[i] != want {
					t.Errorf("batch of %d (forgeries: %v), heartbeat %d: batch says %v, Verify %v", size, forged, i, valid[i], want)
				}
				if !forged && !valid[i] {
					t.Errorf("batch of %d, heartbeat %d: a genuine signature was refused", size, i)
				}
			}
		}
	}
}
