package idemcli

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// redactURL hides in msg the secrets that raw, a --db or --keys value,
// may carry, since errors end up on terminals and in logs. It reads raw by
// hand rather than through net/url, so that a value too malformed to parse
// (whose parser errors repeat it whole) is covered too, and it is
// generous: the password is everything between the first ':' after the
// scheme and the last '@' of the whole value, wherever a '/', '?' or '#'
// inside it would make a parser cut, and everything after a password
// parameter (?password=…, sslpassword, passwd, pass) to the end of the
// value; each piece of those between such characters is hidden as well,
// in case a parser quoted only a piece. Each is hidden as written,
// percent-decoded and Go-quoted.
func redactURL(msg, raw string) string {
	for _, secret := range urlSecrets(raw) {
		msg = strings.ReplaceAll(msg, secret, "xxxxx")
	}
	return msg
}

// minPiece is the shortest piece of a password hidden on its own: shorter
// ones would blank out ordinary words of the message.
const minPiece = 3

// urlSecrets returns the texts redactURL hides, longest first.
func urlSecrets(raw string) []string {
	var secrets []string
	add := func(s string, minLen int) {
		for _, v := range []string{s, pathUnescape(s), queryUnescape(s), quoted(s)} {
			if len(v) >= minLen && !slices.Contains(secrets, v) {
				secrets = append(secrets, v)
			}
		}
	}
	addPassword := func(pw string) {
		add(pw, 1)
		for _, piece := range strings.FieldsFunc(pw, isURLDelimiter) {
			add(piece, minPiece)
		}
	}

	rest := raw
	if _, after, ok := strings.Cut(raw, "://"); ok {
		rest = after
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if _, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
			addPassword(pw)
		}
	}
	if _, query, ok := strings.Cut(raw, "?"); ok {
		// A password parameter's value runs, generously, to the end of
		// the value: an unencoded '&', ';' or '#' in it would make the
		// rest of it read as other parameters, which parsers name in
		// their errors.
		lower := strings.ToLower(query)
		for _, name := range []string{"password=", "sslpassword=", "passwd=", "pass="} {
			for from := 0; ; {
				i := strings.Index(lower[from:], name)
				if i < 0 {
					break
				}
				i += from
				from = i + len(name)
				if i > 0 && !strings.ContainsRune("&;#?", rune(lower[i-1])) {
					continue // the end of another name ("nopassword=")
				}
				if value := query[from:]; value != "" {
					addPassword(value)
				}
			}
		}
	}
	slices.SortStableFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	return secrets
}

// isURLDelimiter reports a character at which a URL parser may cut a
// value, or which a message may quote differently.
func isURLDelimiter(r rune) bool {
	return strings.ContainsRune(":/?#[]@!$&'()*+,;=%\"\\` \t", r)
}

func pathUnescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

func queryUnescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

// quoted is s as a Go-quoted string shows it, without the quotes.
func quoted(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
