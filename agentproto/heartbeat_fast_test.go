package agentproto

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzHeartbeatFastPath: whatever the fast decoder accepts, the strict
// decoder accepts too, as the same heartbeat.
func FuzzHeartbeatFastPath(f *testing.F) {
	for _, s := range fastPathCases(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := decodeHeartbeatFast(data)
		if !ok {
			return
		}
		strict, err := decodeHeartbeatStrict(data)
		if err != nil {
			t.Fatalf("fast path accepted %q, the strict decoder refuses it: %v", data, err)
		}
		if fast.Version != strict.Version || fast.BootID != strict.BootID || fast.AgentDigest != strict.AgentDigest ||
			fast.MachineID != strict.MachineID || !fast.Timestamp.Equal(strict.Timestamp) || fast.Timestamp.Location() != strict.Timestamp.Location() ||
			fast.Nonce != strict.Nonce || !bytes.Equal(fast.Signature, strict.Signature) {
			t.Fatalf("%q: fast path %+v, strict %+v", data, fast, strict)
		}
	})
}

// decodeHeartbeatStrict is DecodeHeartbeat without the fast path.
func decodeHeartbeatStrict(data []byte) (Heartbeat, error) {
	var w heartbeatWire
	if err := decodeStrictVersions(data, MaxHeartbeatSize, "heartbeat", heartbeatShape, &w, HeartbeatV1, HeartbeatVersion); err != nil {
		return Heartbeat{}, err
	}
	return heartbeatFromWire(w)
}

func fastPathCases(t testing.TB) []string {
	valid := string(signedHeartbeat(t))
	v2 := string(signedHeartbeatV2(t))
	return []string{
		v2,
		strings.Replace(v2, `"version":2`, `"version":1`, 1),
		strings.Replace(v2, `"boot_id"`, `"boot_ID"`, 1),
		strings.Replace(v2, testBoot.String(), strings.ToUpper(testBoot.String()), 1),
		strings.Replace(v2, testBoot.String(), "00000000-0000-0000-0000-000000000000", 1),
		strings.Replace(valid, `"version":1`, `"version":2`, 1),
		strings.Replace(valid, `}`, `,"boot_id":"`+testBoot.String()+`"}`, 1),
		valid,
		" \n" + valid + "\r\n",
		strings.ReplaceAll(valid, ",", " ,\t"),
		strings.ReplaceAll(valid, `"version":1,`, "") + "",
		strings.Replace(valid, `{"version":1,`, `{`, 1)[:len(valid)-len(`"version":1,`)-1] + `,"version":1}`,
		strings.Replace(valid, `"version":1`, `"version":10`, 1),
		strings.Replace(valid, `"version":1`, `"version":1.0`, 1),
		strings.Replace(valid, `"version":1`, `"version":2`, 1),
		strings.Replace(valid, `"version":1`, `"Version":1`, 1),
		strings.Replace(valid, `"nonce"`, `"non\u0063e"`, 1),
		strings.Replace(valid, `"version":1,`, `"version":1,"version":1,`, 1),
		strings.Replace(valid, `}`, `,"x":1}`, 1),
		valid + "{}",
		strings.Replace(valid, "Z", "+02:00", 1),
	}
}

// The common forms take the fast path; the near misses do not, and get
// the strict decoder's verdict.
func TestHeartbeatFastPath(t *testing.T) {
	cases := fastPathCases(t)
	wantFast := map[int]bool{0: true, 7: true, 8: true, 9: true, 11: true, 20: true}
	for i, c := range cases {
		_, fast := decodeHeartbeatFast([]byte(c))
		if fast != wantFast[i] {
			t.Errorf("case %d %q: fast path %v, want %v", i, c, fast, wantFast[i])
		}
		got, err := DecodeHeartbeat([]byte(c))
		strict, serr := decodeHeartbeatStrict([]byte(c))
		if (err == nil) != (serr == nil) || (err != nil && err.Error() != serr.Error()) {
			t.Errorf("case %d %q: DecodeHeartbeat error %v, strict decoder %v", i, c, err, serr)
		}
		if err == nil && (got.MachineID != strict.MachineID || !got.Timestamp.Equal(strict.Timestamp) || !bytes.Equal(got.Signature, strict.Signature)) {
			t.Errorf("case %d: %+v, strict %+v", i, got, strict)
		}
	}
}

func BenchmarkDecodeHeartbeat(b *testing.B) {
	valid := []byte(fastPathCases(b)[0])
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeHeartbeat(valid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeHeartbeatStrict(valid); err != nil {
				b.Fatal(err)
			}
		}
	})
}
