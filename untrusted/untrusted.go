// Package untrusted bounds and cleans text that comes from outside
// Shepherd: a machine's SSH server, a BMC's answer, an agent's message.
// Such text reaches PostgreSQL (which refuses NUL and invalid UTF-8, and
// fails the transaction that carries it), logs and operators' terminals
// (where escape sequences act), and memory (where an unbounded answer kills
// the daemon). Everything from outside goes through Text or Line before it
// is logged, stored or rendered, and through Read (ReadFile for a file)
// before it is held.
package untrusted

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"unicode/utf8"
)

// Limit is the size, in bytes, to which Text and Line cut what they keep:
// enough for any useful error message, small enough that a hostile answer
// costs nothing to log, store twice and render.
const Limit = 4096

// truncatedMark ends a text that was cut; it says how much was dropped so
// that an operator knows the rest exists.
const truncatedMark = "… [truncated %d bytes]"

// Text returns s made safe to store, log and print: invalid UTF-8 becomes
// U+FFFD, NUL and every other control character except newline and tab is
// written as a visible escape (\x1b, \x85, \u202e), and the result is cut to at
// most limit bytes (Limit when limit <= 0) at a character boundary, with a
// mark saying how many bytes of s were dropped.
func Text(s string, limit int) string { return clean(s, limit, false) }

// Line is Text for a single line: newlines and tabs are escaped too, so a
// hostile text cannot forge further lines in a log or a table.
func Line(s string, limit int) string { return clean(s, limit, true) }

// Visible is Text without the cut: for a whole document rendered for a
// person (a status page), whose every part that came from outside must
// reach the reader visibly escaped, including parts a template added after
// they were read and bounded. Escaping the rendered document, rather than
// each field, covers fields added later too.
func Visible(s string) string {
	if !needsEscape(s) {
		return s
	}
	return clean(s, math.MaxInt, false)
}

// needsEscape reports whether Visible would change s.
func needsEscape(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size <= 1) || (r != '\n' && r != '\t' && isControl(r)) {
			return true
		}
		i += size
	}
	return false
}

// isControl reports the characters Text escapes: C0 and C1 controls, DEL
// and the formatting characters.
func isControl(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || isFormatting(r)
}

func clean(s string, limit int, oneLine bool) string {
	if limit <= 0 {
		limit = Limit
	}
	if len(s) <= limit && printableASCII(s) {
		// Nothing to escape or cut: the common case (provider ids on
		// every claim) costs no copy.
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), limit) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size <= 1:
			piece = "\uFFFD"
		case r == '\n' || r == '\t':
			if oneLine {
				piece = escape(r)
			} else {
				piece = string(r)
			}
		case isControl(r):
			piece = escape(r)
		default:
			piece = s[i : i+size]
		}
		if b.Len()+len(piece) > limit {
			fmt.Fprintf(&b, truncatedMark, len(s)-i)
			return b.String()
		}
		b.WriteString(piece)
		i += size
	}
	return b.String()
}

// printableASCII reports whether s is only printable ASCII (space to
// tilde), which clean keeps as it is.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// isFormatting reports the invisible characters that reorder or hide text
// on a terminal or a page (bidirectional overrides, line and paragraph
// separators): shown escaped so that what an operator reads is what was sent.
func isFormatting(r rune) bool {
	switch {
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x2028, r == 0x2029, r == 0xfeff:
		return true
	}
	return false
}

func escape(r rune) string {
	switch r {
	case '\n':
		return `\n`
	case '\t':
		return `\t`
	case '\r':
		return `\r`
	}
	if r < 0x100 {
		return fmt.Sprintf(`\x%02x`, r)
	}
	return fmt.Sprintf(`\u%04x`, r)
}

// JSON returns data, a JSON text as encoding/json writes it, with every
// character Text escapes and encoding/json leaves raw (C1 controls such as
// U+009B, which a terminal takes for CSI, DEL, and bidirectional overrides
// such as U+202E) written as a \u escape: a decoder reads back the same
// value, and a terminal or pager showing the JSON shows the escape rather
// than acting on it. Outside strings a JSON text holds only ASCII
// punctuation, letters, digits and white space, so every such character is
// inside a string, where the escape is valid. Invalid UTF-8 (which
// encoding/json never writes) is left as it is.
func JSON(data []byte) []byte {
	var out []byte
	last := 0
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r >= 0x7f && !(r == utf8.RuneError && size <= 1) && isControl(r) {
			if out == nil {
				out = make([]byte, 0, len(data)+32)
			}
			out = append(out, data[last:i]...)
			out = fmt.Appendf(out, `\u%04x`, r)
			last = i + size
		}
		i += size
	}
	if out == nil {
		return data
	}
	return append(out, data[last:]...)
}

// Read reads at most limit bytes of r and reports whether r had more. It
// never holds more than limit+1 bytes, whatever r sends, so a hostile or
// broken peer cannot grow the daemon's memory.
func Read(r io.Reader, limit int64) (data []byte, truncated bool, err error) {
	data, err = io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(data)) > limit {
		return data[:limit], true, err
	}
	return data, false, err
}

// ReadFile reads the regular file path (symlinks followed) if it holds at
// most limit bytes. Anything but a regular file is refused before it is
// opened: a FIFO would block the reader, and a device such as /dev/zero
// never ends.
func ReadFile(path string, limit int64) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, info.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, cut, err := Read(f, limit)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if cut {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}
