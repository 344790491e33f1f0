package idemcheck_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoServer runs every request (no idempotency: check 1 fails and shows
// the answers) and answers with what a careless API echoes: the request's
// credentials and its URI.
func echoServer(t *testing.T) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		n++
		id := n
		mu.Unlock()
		if r.Method == http.MethodGet {
			w.Header().Set("X-Total-Count", strconv.Itoa(id))
			fmt.Fprint(w, "[]")
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "auth=%s cookie=%s key=%s uri=%s id=%d", r.Header.Get("Authorization"), r.Header.Get("Cookie"),
			r.Header.Get("X-Api-Key"), r.URL.RequestURI(), id)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// secretPieces and secretGlue make the secrets: pieces of letters and
// digits, each beginning with a letter no hexadecimal number or UUID
// holds, so that a piece found in the output is a leak and not a
// coincidence, glued by the characters a URL or a shell treats apart.
const (
	pieceStart = "GHJKLMNPQRSTUVWXYZ"
	pieceRest  = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	secretGlue = `/#? "@:%&=+;',\~!$*()[]{}|<>^` + "`\t-._é日"
)

func newSecret(rng *rand.Rand) (secret string, pieces []string) {
	var b strings.Builder
	if rng.IntN(4) == 0 {
		// Digits first: url.Parse may read them as a port.
		d := strconv.Itoa(10000 + rng.IntN(50000))
		b.WriteString(d)
		pieces = append(pieces, d)
		b.WriteByte("/?#"[rng.IntN(3)])
	}
	for i := range 2 + rng.IntN(3) {
		if i > 0 {
			glue := []rune(secretGlue)
			b.WriteRune(glue[rng.IntN(len(glue))])
		}
		p := []byte{pieceStart[rng.IntN(len(pieceStart))]}
		for range 3 + rng.IntN(5) {
			p = append(p, pieceRest[rng.IntN(len(pieceRest))])
		}
		b.Write(p)
		pieces = append(pieces, string(p))
	}
	return b.String(), pieces
}

// leaks returns how out shows secret or one of its pieces, or "".
func leaks(out, secret string, pieces []string) string {
	q := strconv.Quote(secret)
	j, _ := json.Marshal(secret)
	for _, e := range []string{secret, q[1 : len(q)-1], string(j[1 : len(j)-1]), url.QueryEscape(secret), url.PathEscape(secret)} {
		if strings.Contains(out, e) {
			return fmt.Sprintf("the secret as %q", e)
		}
	}
	for _, p := range pieces {
		if strings.Contains(out, p) {
			return fmt.Sprintf("the piece %q", p)
		}
	}
	return ""
}

// No credential given to idem check is printed, whatever its shape and
// wherever it is given: a URL's password or user name (written raw, with
// the / # ? space " @ that url.Parse stops at, or percent-encoded), a
// query parameter, a credential header, a malformed -H, a value split by
// the shell into arguments; in the main URL or --count-url; in the text
// report, the JSON report, load mode and every error; against a correct
// server, one that echoes the credentials back in its answers, and an
// address where nothing listens.
func TestCredentialsNeverPrinted(t *testing.T) {
	live, _ := protectedServer(t)
	echo := echoServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)

	type target struct{ base, count string }
	targets := []target{{live.URL, live.URL + "/orders"}, {echo.URL, echo.URL + "/orders"}, {dead, dead + "/orders"}}
	// Each shape puts secret somewhere and returns the arguments before
	// the mode's flags.
	withUser := func(base, info string) string { return strings.Replace(base, "://", "://"+info+"@", 1) }
	noColon := func(s string) string { return strings.ReplaceAll(s, ":", "x") }
	shapes := map[string]func(tg target, secret string) []string{
		"password raw": func(tg target, s string) []string {
			return []string{"--count-url", tg.count, withUser(tg.base, "alice:"+s) + "/orders"}
		},
		"password encoded": func(tg target, s string) []string {
			return []string{"--count-url", tg.count, withUser(tg.base, url.UserPassword("alice", s).String()) + "/orders"}
		},
		"token as user name": func(tg target, s string) []string {
			return []string{"--count-url", tg.count, withUser(tg.base, noColon(s)) + "/orders"}
		},
		"token as user name, encoded": func(tg target, s string) []string {
			return []string{"--count-url", tg.count, withUser(tg.base, url.User(s).String()) + "/orders"}
		},
		"password in count URL": func(tg target, s string) []string {
			return []string{"--count-url", withUser(tg.count, "alice:"+s), tg.base + "/orders"}
		},
		"no scheme": func(tg target, s string) []string {
			return []string{"--count-url", tg.count, "alice:" + s + "@" + strings.TrimPrefix(tg.base, "http://") + "/orders"}
		},
		"query token": func(tg target, s string) []string {
			// As the URL delimits a value: & and # written encoded.
			v := strings.NewReplacer("&", "%26", "#", "%23").Replace(s)
			return []string{"--count-url", tg.count + "?access_token=" + v, tg.base + "/orders?api_key=" + url.QueryEscape(s)}
		},
		"authorization": func(tg target, s string) []string {
			return []string{"-H", "Authorization: Bearer " + s, "--count-url", tg.count, tg.base + "/orders"}
		},
		"basic": func(tg target, s string) []string {
			return []string{"-H", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(noColon(s)+":"+s)), "--count-url", tg.count, tg.base + "/orders"}
		},
		"cookie": func(tg target, s string) []string {
			return []string{"-H", "Cookie: lang=en; session=" + s, "--count-url", tg.count, tg.base + "/orders"}
		},
		"api key": func(tg target, s string) []string {
			return []string{"-H", "X-Api-Key: " + s, "--count-url", tg.count, tg.base + "/orders"}
		},
		"malformed header": func(tg target, s string) []string {
			return []string{"-H", "Authorization Bearer " + s, tg.base + "/orders"}
		},
		"malformed header, alone": func(tg target, s string) []string {
			return []string{"-H", noColon(s), tg.base + "/orders"}
		},
		"split by the shell": func(tg target, s string) []string {
			return []string{"-H", "Authorization:", "Bearer", s, tg.base + "/orders"}
		},
		"split by the shell, dash first": func(tg target, s string) []string {
			return []string{"-H", "Authorization:", "Bearer", "-" + s, tg.base + "/orders"}
		},
	}
	names := make([]string, 0, len(shapes))
	for name := range shapes {
		names = append(names, name)
	}
	modes := [][]string{
		{"-n", "2", "--timeout", "5s"},
		{"--json", "-n", "2", "--timeout", "5s"},
		{"--load", "--duration", "30ms", "--concurrency", "2", "--timeout", "5s"},
		{"--load", "--json", "--duration", "30ms", "--concurrency", "2", "--timeout", "5s"},
	}

	run := func(t *testing.T, secret string, pieces []string, args []string) {
		t.Helper()
		_, out, errOut := run(t, args...)
		if leak := leaks(out+errOut, secret, pieces); leak != "" {
			t.Fatalf("secret %q, pieces %q: idem check %q shows %s:\n%s%s", secret, pieces, args, leak, out, errOut)
		}
	}
	// The shapes the review met, then random ones.
	for _, raw := range []string{
		"http://alice:s3cr/et@127.0.0.1:1/orders", "http://alice:s3cr#et@127.0.0.1:1/orders",
		"http://alice:s3 cr@127.0.0.1:1/orders", `http://alice:s3"cr@127.0.0.1:1/orders`,
	} {
		for _, args := range [][]string{{raw}, {"--count-url", raw, dead}, {"--load", raw}, {dead, raw}} {
			run(t, "s3cr", nil, args)
		}
	}
	run(t, "s3cr3t-token", nil, []string{"-H", "Authorization Bearer s3cr3t-token", dead})

	for range 60 {
		secret, pieces := newSecret(rng)
		shape := names[rng.IntN(len(names))]
		tg := targets[rng.IntN(len(targets))]
		mode := modes[rng.IntN(len(modes))]
		args := append(append([]string{}, mode...), shapes[shape](tg, secret)...)
		run(t, secret, pieces, args)
	}
}
