package idemcli

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

// secretMark is in every piece of every password below, and in nothing
// else: output holding it shows (part of) a password.
const secretMark = "cr3t"

// TestSecretsNeverPrinted feeds --db and --keys values of many shapes to
// every command that reads them, each value holding a password made of
// pieces ("S3cr3tXY") joined by the characters that break URL parsers
// ('/', '?', '#', '@', '%', …), written raw or percent-encoded, and checks
// that no piece of it reaches stdout or stderr, whatever the command
// says about the value. Every value points at a closed port, so that each
// command fails fast at the latest when it connects.
func TestSecretsNeverPrinted(t *testing.T) {
	sqlite := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	values := []string{
		// The shapes that printed whole URLs before.
		"redis://:S3cr3t?PW@127.0.0.1:1/0",
		"postgres://localhost:1234/S3cr3tPW@127.0.0.1:1/db",
		"mariadb://root:S3cr3tPW@127.0.0.1:1/test",
		"POSTGRES://u:S3cr3tPW@127.0.0.1:1/db",
		"redis://u:S3cr3tPW%zz@127.0.0.1:1/0",
		"redis://u:S3cr3tPW@h:port/0",
		"redis:/u:S3cr3tPW@h%zz/0",
		"postgres://u@127.0.0.1:1/db?password=S3cr3tPW&connect_timeout=1",
		"postgres://u:S3cr3tPW@127.0.0.1:1/db?connect_timeout=1",
		"mysql://root:S3cr3tPW@127.0.0.1:1/test?timeout=1s",
		"mysql://root:S3cr3tPW@127.0.0.1:1/test?nosuchoption=1",
		"mysql://root:S3cr3tPW@127.0.0.1:1/test?tls=S3cr3tPW",
		"postgres://u:S3cr3t\"PW@127.0.0.1:1/db",
		"postgres://u:S3cr3t\\PW@127.0.0.1:1/db",
		"postgres://u:S3cr3t\x1bPW@127.0.0.1:1/db",
		"postgres://u:S3cr3t PW@127.0.0.1:1/db",
		"postgres://u:S3cr3tÉPW@127.0.0.1:1/db",
	}
	rng := rand.New(rand.NewPCG(20261201, 1)) // fixed: the same shapes every run
	for range 150 {
		values = append(values, randomSecretURL(rng))
	}

	type run1 struct{ args []string }
	var runs []run1
	for _, v := range values {
		runs = append(runs,
			run1{[]string{"serve", "--addr", "127.0.0.1:0", "--db", v}},
			run1{[]string{"migrate", "--db", v}},
			run1{[]string{"purge", "--db", v}},
			run1{[]string{"inspect", "--key", "k", "--db", v}},
			run1{[]string{"serve", "--addr", "127.0.0.1:0", "--db", sqlite, "--keys", v}},
			run1{[]string{"inspect", "--key", "k", "--keys", v}},
			run1{[]string{"purge", "--batch", v}}, // a URL given to the wrong flag
		)
	}
	for i, r := range runs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			code, out, errOut := run(r.args...)
			if code == ExitOK {
				t.Errorf("idem %q: exit 0", r.args)
			}
			if strings.Contains(out+errOut, secretMark) {
				t.Errorf("idem %q: exit %d, the output shows the password:\n%s%s", r.args, code, out, errOut)
			}
			if strings.Count(errOut, "\n") != 1 {
				t.Errorf("idem %q: stderr %q, want one line", r.args, errOut)
			}
		})
	}

	target := dbTarget{dialect: dialectPostgres, url: "postgres://postgres:S3cr3tPW@127.0.0.1:5432/test?sslpassword=S3cr3tPW"}
	if d := target.describe(); strings.Contains(d, secretMark) {
		t.Errorf("describe() = %q", d)
	}
}

// randomSecretURL returns a --db or --keys value of a random shape whose
// password is made of pieces holding secretMark.
func randomSecretURL(rng *rand.Rand) string {
	const delims = "/?#@:%&=;+[]'\"\\!$()*, "
	var pw strings.Builder
	for i := range 1 + rng.IntN(3) {
		if i > 0 || rng.IntN(4) == 0 {
			pw.WriteByte(delims[rng.IntN(len(delims))])
		}
		pw.WriteString("S3" + secretMark + string(rune('A'+rng.IntN(26))) + string(rune('a'+rng.IntN(26))))
	}
	if rng.IntN(4) == 0 {
		pw.WriteByte(delims[rng.IntN(len(delims))])
	}
	password := pw.String()
	if rng.IntN(3) == 0 {
		password = url.QueryEscape(password) // the right way: must stay hidden too
	}
	scheme := []string{"postgres://", "postgresql://", "mysql://", "redis://", "rediss://", "mariadb://", "POSTGRES://", "redis:/", "postgres:", ""}[rng.IntN(10)]
	host := "127.0.0.1:1"
	path := []string{"/db", "/0", "", "/test"}[rng.IntN(4)]
	switch rng.IntN(7) {
	case 0:
		return scheme + ":" + password + "@" + host + path
	case 1:
		return scheme + host + path + "?password=" + password
	case 2:
		return scheme + "localhost:1234/" + password + "@" + host + path
	case 3:
		return scheme + "u:" + password + "@" + host + path + "?connect_timeout=1&sslmode=disable"
	case 4:
		return scheme + "u:" + password + "@" + host + path + "?sslpassword=" + password
	default:
		return scheme + "u:" + password + "@" + host + path
	}
}
