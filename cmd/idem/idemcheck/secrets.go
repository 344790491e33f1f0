package idemcheck

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
)

// What the operator gives may hold credentials: a URL's user info, a
// query parameter such as ?access_token=…, a header such as
// Authorization or Cookie. None of them is ever printed. URLs are shown
// with those parts replaced by xxxxx (redactURL, shownURL); header values
// are never shown at all; and every value found in those places is also
// replaced wherever it appears in what is printed, since a server may
// echo it back (secrets).

// hidden replaces a credential in what is printed.
const hidden = "xxxxx"

// minSecretLen is the shortest value replaced wherever it appears: a
// shorter one would hit unrelated text (counts, statuses). The places
// known to hold a credential are hidden whatever their length.
const minSecretLen = 4

// redactURL is raw as an error may show it. When raw does not parse, or
// parses with an @ after its authority, the text between "://" and its
// last @ is taken for user info: a password holding an unencoded / ? # or
// space makes url.Parse see a host, a port or a path where the user meant
// a password, and an @ later in the URL is the sign of it. The user name
// is kept when a colon separates a password from it; a user name alone,
// often a token (https://TOKEN@host), is hidden too. Query parameters
// whose names suggest a credential have their values hidden. An error is
// where a misread URL ends up (its "host" cannot be reached), so the
// error shows the cautious reading; a report, whose target answered,
// shows the URL as it was used (shownURL).
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || atAfterAuthority(raw) {
		return redactRawURL(raw)
	}
	return redactParsed(u)
}

// shownURL is raw as a report shows it: the URL the requests went to and
// the target answered, with its user info and credential parameters
// hidden. A URL that does not parse never gets a report.
func shownURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return redactURL(raw) // not a URL any request went to
	}
	return redactParsed(u)
}

// atAfterAuthority reports whether raw has an @ past its authority (in
// its path, query or fragment, as url.Parse splits it), or has no
// authority and an @ anywhere.
func atAfterAuthority(raw string) bool {
	rest, ok := afterScheme(raw)
	if !ok {
		return strings.Contains(raw, "@")
	}
	end := strings.IndexAny(rest, "/?#")
	return end >= 0 && strings.Contains(rest[end:], "@")
}

// afterScheme is what follows "scheme://" (or a leading "//") in raw.
func afterScheme(raw string) (string, bool) {
	if i := strings.Index(raw, "://"); i >= 0 {
		return raw[i+3:], true
	}
	if rest, ok := strings.CutPrefix(raw, "//"); ok {
		return rest, true
	}
	return "", false
}

// redactParsed is u with its user info and credential parameters hidden.
func redactParsed(u *url.URL) string {
	v := *u
	if v.User != nil {
		if _, ok := v.User.Password(); ok {
			v.User = url.UserPassword(v.User.Username(), hidden)
		} else {
			v.User = url.User(hidden)
		}
	}
	v.RawQuery = redactQuery(v.RawQuery)
	return v.String()
}

// redactRawURL hides, in a URL taken as text, everything between "://"
// and the last @ (the user name before a colon excepted), and the values
// of credential parameters. Where the query begins depends on the
// reading: at the first ? for url.Parse, at the first ? after that last @
// for the reading that takes it for the end of the user info (a ? may be
// in a password, an @ in a token). Both readings' values are hidden.
func redactRawURL(raw string) string {
	var hide [][2]int // byte ranges of raw
	start := 0
	if rest, ok := afterScheme(raw); ok {
		start = len(raw) - len(rest)
	}
	at := strings.LastIndex(raw[start:], "@")
	if at >= 0 {
		at += start
		if c := strings.Index(raw[start:at], ":"); c >= 0 {
			hide = append(hide, [2]int{start + c + 1, at})
		} else {
			hide = append(hide, [2]int{start, at})
		}
	}
	hide = append(hide, credentialValues(raw, strings.Index(raw, "?"))...)
	if at >= 0 {
		if q := strings.Index(raw[at:], "?"); q >= 0 {
			hide = append(hide, credentialValues(raw, at+q)...)
		}
	}
	return hideRanges(raw, hide)
}

// credentialValues are the byte ranges of raw holding the values of
// credential parameters of the query that begins at raw[q], a ?, and
// ends at the next # or the end.
func credentialValues(raw string, q int) [][2]int {
	if q < 0 {
		return nil
	}
	end := len(raw)
	if f := strings.Index(raw[q:], "#"); f >= 0 {
		end = q + f
	}
	var out [][2]int
	for i := q + 1; i <= end; {
		next := strings.Index(raw[i:end], "&")
		if next < 0 {
			next = end - i
		}
		name, value, ok := strings.Cut(raw[i:i+next], "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if ok && credentialName(name) {
			from := i + next - len(value)
			out = append(out, [2]int{from, i + next})
		}
		i += next + 1
	}
	return out
}

// hideRanges replaces the given byte ranges of s with xxxxx, once for
// ranges that overlap or touch.
func hideRanges(s string, ranges [][2]int) string {
	slices.SortFunc(ranges, func(a, b [2]int) int { return a[0] - b[0] })
	var b strings.Builder
	pos := 0
	for i := 0; i < len(ranges); {
		from, to := ranges[i][0], ranges[i][1]
		for i++; i < len(ranges) && ranges[i][0] <= to; i++ {
			to = max(to, ranges[i][1])
		}
		if from < pos {
			from = pos
		}
		if to <= from {
			continue
		}
		b.WriteString(s[pos:from])
		b.WriteString(hidden)
		pos = to
	}
	b.WriteString(s[pos:])
	return b.String()
}

// redactQuery hides the values of the parameters of a raw query whose
// names suggest a credential, keeping the rest as written.
func redactQuery(raw string) string {
	if raw == "" {
		return raw
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		name, _, ok := strings.Cut(p, "=")
		if !ok {
			continue
		}
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if credentialName(name) {
			parts[i] = p[:strings.Index(p, "=")+1] + hidden
		}
	}
	return strings.Join(parts, "&")
}

// credentialWords are the words of a header or parameter name that make
// its value a credential: Authorization, X-Api-Key, access_token,
// X-Amz-Signature, sig (a SAS signature), session_id, …
var credentialWords = map[string]bool{
	"auth": true, "authorization": true, "authentication": true, "bearer": true,
	"token": true, "jwt": true, "otp": true,
	"key": true, "apikey": true,
	"secret": true, "password": true, "passwd": true, "pwd": true, "pass": true, "passphrase": true,
	"session": true, "sessionid": true, "sid": true, "cookie": true,
	"sig": true, "signature": true, "credential": true, "credentials": true,
}

// credentialParts catch names written as one word: accesstoken,
// clientsecret, userpassword.
var credentialParts = []string{"token", "secret", "passw", "apikey", "credential", "signature"}

// credentialName reports whether a header or parameter name suggests that
// its value is a credential.
func credentialName(name string) bool {
	lower := strings.ToLower(name)
	for _, part := range credentialParts {
		if strings.Contains(lower, part) {
			return true
		}
	}
	for _, w := range nameWords(name) {
		if credentialWords[strings.ToLower(w)] {
			return true
		}
	}
	return false
}

// nameWords splits a name into words: at every character that is not a
// letter or a digit, and at the upper-case letter that begins a word
// written in camel case (apiKey, XAuthToken, HTTPAuth).
func nameWords(name string) []string {
	var words []string
	rs := []rune(name)
	start := -1
	for i, r := range rs {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			if start >= 0 {
				words = append(words, string(rs[start:i]))
			}
			start = -1
			continue
		}
		if start >= 0 && unicode.IsUpper(r) &&
			(unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1]))) {
			words = append(words, string(rs[start:i]))
			start = i
		}
		if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		words = append(words, string(rs[start:]))
	}
	return words
}

// secrets are the credential values a configuration holds: every one is
// replaced by xxxxx wherever it appears in what is printed. errorsOnly
// are replaced in errors only: the parts of a URL that may be pieces of a
// password url.Parse misread as a host and port (see redactURL), which
// are the URL's real host and port once the target has answered.
type secrets struct {
	values     []string
	errorsOnly []string
}

// newSecrets collects the credentials in urls and header.
func newSecrets(urls []string, header http.Header) *secrets {
	s := &secrets{}
	for _, raw := range urls {
		s.addURL(raw)
	}
	for name, values := range header {
		if !credentialName(name) {
			continue
		}
		for _, v := range values {
			s.addHeaderValue(v)
		}
	}
	slices.SortFunc(s.values, longestFirst)
	slices.SortFunc(s.errorsOnly, longestFirst)
	s.values, s.errorsOnly = slices.Compact(s.values), slices.Compact(s.errorsOnly)
	return s
}

func longestFirst(a, b string) int {
	if len(a) != len(b) {
		return len(b) - len(a)
	}
	return strings.Compare(a, b)
}

func (s *secrets) add(v string) {
	v = strings.TrimSpace(v)
	if len(v) < minSecretLen {
		return
	}
	s.values = append(s.values, v)
	// As it may come back: percent-encoded in a URL an answer names.
	for _, e := range []string{url.QueryEscape(v), url.PathEscape(v)} {
		if e != v {
			s.values = append(s.values, e)
		}
	}
}

func (s *secrets) addURL(raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		return
	}
	if u.User != nil {
		user := u.User.Username()
		if pw, ok := u.User.Password(); ok {
			s.add(pw)
			// As net/http sends it, in case an answer echoes the header.
			s.add(base64.StdEncoding.EncodeToString([]byte(user + ":" + pw)))
		} else {
			s.add(user)
		}
	}
	if atAfterAuthority(raw) {
		// The host and port url.Parse found may be the user name and the
		// start of a password, and connection errors name them.
		for _, v := range []string{u.Host, ":" + u.Port()} {
			if len(v) >= minSecretLen {
				s.errorsOnly = append(s.errorsOnly, v)
			}
		}
	}
	for name, values := range u.Query() {
		if credentialName(name) {
			for _, v := range values {
				s.add(v)
			}
		}
	}
}

// addHeaderValue adds the value of a credential header, and its parts:
// the credentials after an Authorization scheme (Basic decoded), the
// value of each cookie.
func (s *secrets) addHeaderValue(v string) {
	s.add(v)
	if scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
		s.add(cred)
		if strings.EqualFold(scheme, "Basic") {
			if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred)); err == nil {
				s.add(string(b))
				if _, pw, ok := strings.Cut(string(b), ":"); ok {
					s.add(pw)
				}
			}
		}
	}
	for _, c := range strings.Split(v, ";") {
		if _, val, ok := strings.Cut(c, "="); ok {
			s.add(strings.Trim(strings.TrimSpace(val), `"`))
		}
	}
}

// scrub replaces every secret in text with xxxxx; inError adds the
// errors-only ones.
func (s *secrets) scrub(text string, inError bool) string {
	if s == nil {
		return text
	}
	for _, v := range s.values {
		text = strings.ReplaceAll(text, v, hidden)
	}
	if inError {
		for _, v := range s.errorsOnly {
			text = strings.ReplaceAll(text, v, hidden)
		}
	}
	return text
}

// text is s fit to print in a report: secrets replaced, then as safeText.
func (s *secrets) text(text string) string {
	return safeText(s.scrub(text, false))
}
