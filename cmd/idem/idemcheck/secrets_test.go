package idemcheck

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

func TestRedactURL(t *testing.T) {
	cases := []struct{ in, err, shown string }{
		// Parsed: the user name before a password is kept.
		{"http://alice:pw@host/x", "http://alice:xxxxx@host/x", "http://alice:xxxxx@host/x"},
		{"https://TOKEN@host/x", "https://xxxxx@host/x", "https://xxxxx@host/x"},
		{"http://a:p%2Fw@host:1/x", "http://a:xxxxx@host:1/x", "http://a:xxxxx@host:1/x"},
		{"http://host:1/orders?cart_id=c_42", "http://host:1/orders?cart_id=c_42", "http://host:1/orders?cart_id=c_42"},
		{"http://host/o?access_token=abc&cart_id=1&apiKey=k&X-Amz-Signature=s&sig=z&author=bob",
			"http://host/o?access_token=xxxxx&cart_id=1&apiKey=xxxxx&X-Amz-Signature=xxxxx&sig=xxxxx&author=bob",
			"http://host/o?access_token=xxxxx&cart_id=1&apiKey=xxxxx&X-Amz-Signature=xxxxx&sig=xxxxx&author=bob"},
		// Not parsed: user info up to the last @, whatever it holds.
		{"http://alice:s3cr/et@127.0.0.1:1/orders", "http://alice:xxxxx@127.0.0.1:1/orders", "http://alice:xxxxx@127.0.0.1:1/orders"},
		{"http://alice:s3cr#et@127.0.0.1:1/orders", "http://alice:xxxxx@127.0.0.1:1/orders", "http://alice:xxxxx@127.0.0.1:1/orders"},
		{`http://alice:s3 c"r@host/x?token=a b`, "http://alice:xxxxx@host/x?token=xxxxx", "http://alice:xxxxx@host/x?token=xxxxx"},
		{"http://s3cr/et@host:port/x", "http://xxxxx@host:port/x", "http://s3cr/et@host:port/x"},
		{"alice:pw@host/x", "alice:xxxxx@host/x", "alice:xxxxx@host/x"},
		{"http://s3cr/et@host/x", "http://xxxxx@host/x", "http://s3cr/et@host/x"},
		// Parsed, but an @ past the authority: an error reads it
		// cautiously; a report, whose target answered, as it was used.
		{"http://alice:2024/x@host/orders", "http://alice:xxxxx@host/orders", "http://alice:2024/x@host/orders"},
		{"http://u:p@s/s@host/x", "http://u:xxxxx@host/x", "http://u:xxxxx@s/s@host/x"},
		{"http://host:3000/o?email=a@b.c", "http://host:xxxxx@b.c", "http://host:3000/o?email=a@b.c"},
		// Both readings of where the query begins are hidden: an @ in a
		// token, a ? in a password.
		{"http://h:1/o?access_token=ab@cd ef", "http://h:xxxxx", "http://h:1/o?access_token=xxxxx"},
		{"http://alice:pw?token=abc@host/x", "http://alice:xxxxx", "http://alice:xxxxx"},
		{"http://alice:pw@host/x?token=a&b=c#token=d", "http://alice:xxxxx@host/x?token=xxxxx&b=c#token=d", "http://alice:xxxxx@host/x?token=xxxxx&b=c#token=d"},
	}
	for _, c := range cases {
		if got := redactURL(c.in); got != c.err {
			t.Errorf("redactURL(%q) = %q, want %q", c.in, got, c.err)
		}
		if got := shownURL(c.in); got != c.shown {
			t.Errorf("shownURL(%q) = %q, want %q", c.in, got, c.shown)
		}
	}
}

func TestCredentialName(t *testing.T) {
	for name, want := range map[string]bool{
		"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "X-Api-Key": true,
		"X-Auth-Token": true, "XAuthToken": true, "apiKey": true, "api_key": true, "access_token": true,
		"refreshtoken": true, "client_secret": true, "X-Amz-Signature": true, "X-Amz-Credential": true,
		"sig": true, "password": true, "pwd": true, "session_id": true, "Ocp-Apim-Subscription-Key": true,
		"Content-Type": false, "cart_id": false, "author": false, "Accept": false, "X-Request-Id": false,
		"Host": false, "design": false, "keep": false,
	} {
		if got := credentialName(name); got != want {
			t.Errorf("credentialName(%q) = %v, want %v", name, got, want)
		}
	}
}

// Header values that are credentials, and their parts, are replaced
// wherever they appear; other header values are left alone.
func TestSecretsScrub(t *testing.T) {
	s := newSecrets([]string{"http://alice:pa55word@host/x?access_token=tok123"}, http.Header{
		"Authorization": {"Basic YWxpY2U6b3BlbnNlc2FtZQ=="}, // alice:opensesame
		"Cookie":        {"lang=en; session=abcdef0123"},
		"Content-Type":  {"application/json"},
	})
	in := "pa55word tok123 opensesame YWxpY2U6b3BlbnNlc2FtZQ== abcdef0123 application/json en"
	want := "xxxxx xxxxx xxxxx xxxxx xxxxx application/json en"
	if got := s.scrub(in, false); got != want {
		t.Errorf("scrub = %q, want %q", got, want)
	}
}

// The ways a string may come back in a printed text: as given, quoted
// (%q, JSON) and percent-encoded.
func encodings(s string) []string {
	q := strconv.Quote(s)
	j, _ := json.Marshal(s)
	return []string{s, q[1 : len(q)-1], string(j[1 : len(j)-1]), url.QueryEscape(s), url.PathEscape(s)}
}

// An error about a URL never holds its password, whatever the password
// holds, whether or not the URL parses; nor does the URL a report shows
// when the URL is the one the requests went to (it parsed with that
// password as its user info).
func FuzzURLPasswordNeverShown(f *testing.F) {
	for _, pw := range []string{"s3cr/et", "s3cr#et", "s3 cret", `s3"cret`, "s3cr?et", "p@ss/w#rd", "2024/abc", "/abcd",
		"%zzabcd", "ab:cd", "\x01abcd", "abcd\n", "日本語パス"} {
		f.Add("alice", pw, "/orders?cart_id=1")
		f.Add("", pw, "")
	}
	f.Fuzz(func(t *testing.T, user, pw, tail string) {
		if len(pw) < minSecretLen || strings.ContainsAny(user, ":@/?#") || strings.Contains(tail, "@") {
			return
		}
		host := "127.0.0.1:1"
		// What is printed about raw, whose password is pw.
		shown := func(raw, pw string) []string {
			out := []string{redactURL(raw)}
			if err := validURL(raw); err != nil {
				out = append(out, safeErr(err, newSecrets([]string{raw}, nil)).Error())
			}
			if u, err := url.Parse(raw); err == nil && u.User != nil {
				if p, ok := u.User.Password(); (ok && p == pw) || (!ok && u.User.Username() == pw) {
					out = append(out, shownURL(raw))
				}
			}
			return out
		}
		// The same password with its letters and digits changed: the
		// URL parses the same, and what the texts hold of pw with it
		// comes from the rest of the URL and the message.
		other := strings.Map(func(r rune) rune {
			if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
				return 'Q'
			}
			return r
		}, pw)
		for _, url := range []func(pw string) string{
			func(pw string) string { return "http://" + user + ":" + pw + "@" + host + tail },
			func(pw string) string { return "http://" + pw + "@" + host + tail }, // a token as the user name
		} {
			raw := url(pw)
			if strings.HasPrefix(raw, "http://"+pw) && strings.Contains(pw, ":") {
				continue // a user name, shown, then a password
			}
			control := strings.Join(shown(url(other), other), "\n")
			for _, text := range shown(raw, pw) {
				for _, e := range encodings(pw) {
					if strings.Contains(text, e) && !strings.Contains(control, e) {
						t.Fatalf("%q shows the password %q as %q", raw, pw, text)
					}
				}
			}
		}
	})
}

// A URL's parse error never quotes a piece of it.
func TestParseProblemQuotesNothing(t *testing.T) {
	for _, raw := range []string{"http://alice:s3cr/et@127.0.0.1:1/orders", "http://h:port/x", "http://a b/", "http://alice:%zzcd@h/"} {
		_, err := url.Parse(raw)
		if err == nil {
			t.Fatalf("%q parses", raw)
		}
		p := parseProblem(raw, err)
		if problem, _, _ := strings.Cut(p, " ("); strings.Contains(problem, `"`) {
			t.Errorf("parseProblem(%q) = %q: it quotes the URL", raw, p)
		}
	}
}
