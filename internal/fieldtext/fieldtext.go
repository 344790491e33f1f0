// Package fieldtext says which text a stored field may hold: no control
// character but tab. idemcodec.UnmarshalHeader refuses the others in a stored
// header value, idemhttp spaces them out of the headers it stores, and
// ideminbox escapes them out of what it records about a message.
//
// Control characters are the C0 set (U+0000–U+001F), DEL (U+007F) and the
// C1 set (U+0080–U+009F): a terminal acts on each of them (U+009B starts a
// control sequence, U+009D an operating system command, as ESC [ and ESC ]
// do), so none may reach an operator's screen from stored data.
package fieldtext

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// IsCTL reports a control character that a field value may not hold: C0
// but tab, DEL, and C1.
func IsCTL(r rune) bool {
	return (r < 0x20 && r != '\t') || (0x7f <= r && r <= 0x9f)
}

// Clean reports whether s holds no such character.
func Clean(s string) bool { return strings.IndexFunc(s, IsCTL) < 0 }

// Escape writes each control character of s as an escape (\n, \r, \xNN
// for C0 and DEL, \u00NN for C1), keeping the text readable; s itself
// when it holds none.
func Escape(s string) string {
	if Clean(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case IsCTL(r) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case IsCTL(r):
			// \u, not \x: \x9b would read as the byte 0x9b, which is not
			// what the text held (the two bytes of U+009B).
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			// Invalid UTF-8 included: kept byte for byte.
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// Spaced writes each control character of s as a space, as net/http sends
// CR and LF in a header value; s itself when it holds none. The other
// bytes are kept as they were, invalid UTF-8 included.
func Spaced(s string) string {
	if Clean(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if IsCTL(r) {
			b.WriteByte(' ')
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
