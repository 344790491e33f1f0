package idemcheck

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What a report prints comes from two sources that must not be trusted
// with a terminal: the operator's configuration, which may hold
// credentials (see secrets.go), and the server, which chooses every byte
// of its answers. Every string a report, an error or the JSON output
// carries goes through safeText, after the configuration's secrets were
// replaced.

// userinfo matches the userinfo of a URL inside any text: scheme://user:
// then the password, up to the last @ before the host. net/http's own
// redaction (user:***@) matches too, and reads the same as ours afterwards.
// It is a last guard, for URLs in text the checks did not write (a
// server's answer); the URLs of the configuration are redacted by
// redactURL, which does not stop at a / # or space.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:"]*):[^/?#\s"]*@`)

// redactText replaces the password of every URL in s with xxxxx, as
// url.URL.Redacted does, whether or not the URL parses.
func redactText(s string) string {
	return userinfo.ReplaceAllString(s, "${1}:xxxxx@")
}

// printable escapes every rune a terminal could act on instead of showing
// it: C0 and C1 control characters (ESC, CSI U+009B, OSC U+009D, CR, LF …),
// DEL, format characters (bidi overrides and isolates, zero-width
// characters), separators other than the space, and bytes that are not
// UTF-8. They appear as \xNN or \uNNNN. Everything else is kept.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += size
	}
	return b.String()
}

// safeText is s fit to print: passwords redacted, control characters
// escaped.
func safeText(s string) string {
	return printable(redactText(s))
}

// safeError carries an error whose text is fit to print, the
// configuration's secrets replaced, and keeps the error itself for
// errors.Is and errors.As.
type safeError struct {
	err     error
	secrets *secrets
}

func (e safeError) Error() string { return safeText(e.secrets.scrub(e.err.Error(), true)) }
func (e safeError) Unwrap() error { return e.err }

func safeErr(err error, s *secrets) error {
	if err == nil || errors.As(err, new(safeError)) {
		return err
	}
	return safeError{err, s}
}

// errText is an error on one line, fit to print, without the
// "Post \"URL\":" prefix net/http adds.
func errText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return safeText(err.Error())
}

// clip shows at most 120 characters of a body on one line, escaped.
func clip(b []byte) string {
	s := printable(strings.Join(strings.Fields(string(b)), " "))
	if s == "" {
		return "(empty)"
	}
	if utf8.RuneCountInString(s) > 120 {
		s = string([]rune(s)[:117]) + "..."
	}
	return s
}
