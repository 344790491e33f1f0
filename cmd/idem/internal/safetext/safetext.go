// Package safetext escapes what the idem command prints of stored data
// (tenants, keys, error text quoting them) so that it cannot act on the
// terminal, or on what the operator reads there: control characters
// (internal/fieldtext) and the invisible format characters.
//
// The format characters (Unicode category Cf: the bidirectional controls
// U+202A–U+202E and U+2066–U+2069, the zero-width space, joiners and
// no-break space, the soft hyphen, the byte-order mark, …) and the line
// and paragraph separators U+2028 and U+2029 draw nothing, yet a terminal
// and a page apply them: a right-to-left override makes a key read
// backwards, a zero-width space makes two keys look the same. A client
// chooses its keys; an operator must see exactly what they hold.
package safetext

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idem-go/idem/internal/fieldtext"
)

// IsInvisible reports a format character or a line or paragraph
// separator: text that a terminal does not show but applies.
func IsInvisible(r rune) bool {
	return unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// needsEscape reports a character Escape writes as an escape.
func needsEscape(r rune) bool { return fieldtext.IsCTL(r) || IsInvisible(r) }

// Escape writes s as fieldtext.Escape does (control characters as \n, \r,
// \xNN, \u00NN), and each invisible character as \uXXXX (\UXXXXXXXX
// beyond U+FFFF); s itself when it holds none.
func Escape(s string) string {
	if !strings.ContainsFunc(s, needsEscape) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteByte(s[i]) // invalid UTF-8: kept byte for byte, as fieldtext does
		case IsInvisible(r) && r > 0xffff:
			fmt.Fprintf(&b, `\U%08x`, r) // a tag character, as Go writes it
		case IsInvisible(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		case fieldtext.IsCTL(r):
			b.WriteString(fieldtext.Escape(s[i : i+size]))
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// JSON writes DEL, the C1 controls and the invisible characters of the
// JSON text b as \u escapes, which encoding/json leaves raw (it escapes
// C0, and U+2028 and U+2029 already). Outside strings JSON is ASCII, so
// every such character is inside a string, where the escape means the
// same: the output is the same JSON value, with the same strings, that a
// terminal shows as it is.
func JSON(b []byte) []byte {
	esc := func(r rune) bool { return (r >= 0x7f && fieldtext.IsCTL(r)) || IsInvisible(r) }
	if !bytes.ContainsFunc(b, esc) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, b[i]) // encoding/json never writes invalid UTF-8
		case esc(r) && r > 0xffff:
			// JSON escapes a character beyond the BMP as its UTF-16 pair.
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		case esc(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}
