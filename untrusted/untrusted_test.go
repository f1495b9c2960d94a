package untrusted

import (
	"bytes"
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
