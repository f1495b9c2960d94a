package untrusted

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"nul\x00byte", `nul\x00byte`},
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{"\x1b[2Jclear", `\x1b[2Jclear`},
		{"two\nlines\tand tab", "two\nlines\tand tab"},
		{"cr\rc1\u0085del\x7f", `cr\rc1\x85del\x7f`},
		{"bidi\u202eevil", `bidi\u202eevil`},
		{"ünïcödé ok", "ünïcödé ok"},
	} {
		if got := Text(tc.in, 0); got != tc.want {
			t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got, want := Line("a\nb\tc", 0), `a\nb\tc`; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
}

func TestTextTruncates(t *testing.T) {
	in := strings.Repeat("é", 10000) // 20000 bytes
	got := Text(in, 100)
	if !utf8.ValidString(got) {
		t.Fatalf("not valid UTF-8: %q", got)
	}
	if !strings.HasPrefix(got, strings.Repeat("é", 50)) || !strings.HasSuffix(got, "… [truncated 19900 bytes]") {
		t.Fatalf("Text = %q", got)
	}
	if len(Text(strings.Repeat("x", 1<<20), 0)) > Limit+64 {
		t.Fatal("default limit not applied")
	}
}

// Printable ASCII within the limit is kept as it is, and cut like any
// other text beyond it.
func TestPrintableASCII(t *testing.T) {
	ascii := " !09AZaz~"
	if got := Line(ascii, 0); got != ascii {
		t.Errorf("Line(%q) = %q", ascii, got)
	}
	exact := strings.Repeat("x", 100)
	if got := Line(exact, 100); got != exact {
		t.Errorf("Line of exactly the limit = %q", got)
	}
	if got, want := Line(exact+"y", 100), exact+"… [truncated 1 bytes]"; got != want {
		t.Errorf("Line of one byte over the limit = %q, want %q", got, want)
	}
	for _, in := range []string{"a\x7f", "a\x1f", "a\u0080", "tab\t"} {
		if got := Line(in, 0); got == in {
			t.Errorf("Line(%q) kept it unescaped", in)
		}
	}
}

func TestRead(t *testing.T) {
	data, cut, err := Read(bytes.NewReader(make([]byte, 10)), 4)
	if err != nil || !cut || len(data) != 4 {
		t.Fatalf("Read = %d bytes, %v, %v", len(data), cut, err)
	}
	data, cut, err = Read(strings.NewReader("abcd"), 4)
	if err != nil || cut || string(data) != "abcd" {
		t.Fatalf("Read = %q, %v, %v", data, cut, err)
	}
}

func FuzzText(f *testing.F) {
	f.Add("\x00\x1b[2J\xff", 10)
	f.Fuzz(func(t *testing.T, s string, limit int) {
		limit = limit % 10000
		got := Text(s, limit)
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) || strings.ContainsRune(got, 0x1b) {
			t.Fatalf("Text(%q) = %q: not clean", s, got)
		}
		if limit <= 0 {
			limit = Limit
		}
		if len(got) > limit+64 {
			t.Fatalf("Text kept %d bytes, limit %d", len(got), limit)
		}
	})
}

// Visible escapes as Text does but keeps the whole text, and returns a
// text that needs nothing unchanged.
func TestVisible(t *testing.T) {
	long := strings.Repeat("x", 3*Limit)
	for _, tc := range []struct{ in, want string }{
		{"plain\n\ttext", "plain\n\ttext"},
		{"esc\x1b[2J c1\u009b bidi\u202e", `esc\x1b[2J c1\x9b bidi\u202e`},
		{"bad \xff", "bad \uFFFD"},
		{long + "\x1b", long + `\x1b`},
	} {
		if got := Visible(tc.in); got != tc.want {
			t.Errorf("Visible(%.40q) = %.40q, want %.40q", tc.in, got, tc.want)
		}
	}
}

// hostileRunes are what a terminal acts on or a page reorders by, from
// each class: C0 (ESC), DEL, C1 (CSI), bidi override, line separator.
const hostileRunes = "\x1b\x7f\u009b\u202e\u2028\ufeff"

// JSON leaves no C0, C1 or formatting character raw, and a decoder reads
// back the value encoding/json was given.
func TestJSON(t *testing.T) {
	in := map[string]string{"provider_id": "rack1\x1b[2J\u009b31m\u202eevil", "cause": "ok ünïcödé\n"}
	data, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(data)
	if bytes.ContainsAny(got, hostileRunes) {
		t.Errorf("JSON left a control raw: %q", got)
	}
	for _, want := range []string{`\u001b[2J`, `\u009b31m`, `\u202eevil`, "ünïcödé", "{\n  "} {
		if !bytes.Contains(got, []byte(want)) {
			t.Errorf("JSON output %q lacks %q", got, want)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["provider_id"] != in["provider_id"] || back["cause"] != in["cause"] {
		t.Errorf("JSON output decodes to %q (%v), want %q", back, err, in)
	}
	plain := []byte(`{"a": "b"}`)
	if got := JSON(plain); &got[0] != &plain[0] {
		t.Errorf("JSON copied a text that needs no escape")
	}
}

func FuzzJSON(f *testing.F) {
	f.Add("rack1\x1b[2J\u009b\u202e\xff")
	f.Fuzz(func(t *testing.T, s string) {
		data, err := json.Marshal([]string{s, "k" + s})
		if err != nil {
			t.Fatal(err)
		}
		got := JSON(data)
		if bytes.ContainsAny(got, hostileRunes) || bytes.ContainsFunc(got, func(r rune) bool { return r < 0x20 || isControl(r) }) {
			t.Fatalf("JSON(%q) = %q: a control left raw", data, got)
		}
		var want, back []string
		json.Unmarshal(data, &want)
		if err := json.Unmarshal(got, &back); err != nil || len(back) != 2 || back[0] != want[0] || back[1] != want[1] {
			t.Fatalf("JSON(%q) = %q decodes to %q, %v; want %q", data, got, back, err, want)
		}
	})
}
