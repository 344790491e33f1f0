// Package fieldtext says which text a stored header value may hold: no
// control character but tab (idem.UnmarshalHeader refuses the others), and
// turns text that holds some into text that does not.
package fieldtext

import (
	"fmt"
	"strings"
)

// IsCTL reports a control character that a field value may not hold.
func IsCTL(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }

// Clean reports whether s holds no such character.
func Clean(s string) bool { return strings.IndexFunc(s, IsCTL) < 0 }

// Escape writes each control character of s as an escape (\n, \r, \xNN),
// keeping the text readable; s itself when it holds none.
func Escape(s string) string {
	if Clean(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case IsCTL(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Spaced writes each control character of s as a space, as net/http sends
// CR and LF in a header value; s itself when it holds none.
func Spaced(s string) string {
	if Clean(s) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if IsCTL(r) {
			return ' '
		}
		return r
	}, s)
}
