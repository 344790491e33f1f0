package idemcli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/testenv"
)

// runIdem runs the real binary with args in dir and returns its exit
// status and streams.
func runIdem(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, idemBinary(t), args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("idem %q: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

// TestCLIErrorsOneClearLine runs the real binary on the command lines a
// new user gets wrong, and checks that each fails with the right status,
// on one line that names the flag at fault and says what to do, having
// created nothing.
func TestCLIErrorsOneClearLine(t *testing.T) {
	mysqlURL := func(t *testing.T) string {
		cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("mysql://%s:S3cr3tPW@%s/%s", cfg.User, "127.0.0.1:1", cfg.DBName)
	}
	notMySQL := func(t *testing.T) string {
		// A server that answers, but not as MySQL: a line of text, then
		// it hangs up (an HTTP server, a Redis, a PostgreSQL on the
		// wrong port).
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte("-ERR wrong protocol\r\nHTTP/1.1 400 Bad Request\r\n\r\n"))
				c.Close()
			}
		}()
		return "mysql://root:S3cr3tPW@" + ln.Addr().String() + "/test"
	}
	cases := []struct {
		name string
		args func(t *testing.T) []string
		code int
		// want must match the one line on stderr; never must not.
		want, never string
	}{
		{"postgres unreachable", func(t *testing.T) []string {
			return []string{"migrate", "--db", "postgres://postgres@127.0.0.1:1/test"}
		}, ExitFailure, `^idem migrate: cannot reach postgres://postgres@127\.0\.0\.1:1/test: [^;]*connection refused$`, ":;"},
		{"check -n 1", func(t *testing.T) []string { return []string{"check", "-n", "1", "http://127.0.0.1:1/x"} },
			ExitUsage, `^idem check: -n must be at least 2`, "concurrency"},
		{"check -n 0", func(t *testing.T) []string { return []string{"check", "-n", "0", "http://127.0.0.1:1/x"} },
			ExitUsage, `^idem check: -n must be at least 2 .*got 0`, ""},
		{"purge --batch abc", func(t *testing.T) []string { return []string{"purge", "--batch", "abc"} },
			ExitUsage, `^idem purge: invalid value "abc" for flag --batch: want a whole number`, "parse error"},
		{"mysql password", func(t *testing.T) []string { return []string{"migrate", "--db", mysqlURL(t)} },
			ExitFailure, `^idem migrate: cannot reach mysql://\w+:xxxxx@127\.0\.0\.1:1/`, "S3cr3t"},
		{"not mysql", func(t *testing.T) []string { return []string{"migrate", "--db", notMySQL(t)} },
			ExitFailure, `^idem migrate: cannot reach mysql://root:xxxxx@127\.0\.0\.1:\d+/test: `, "packets.go"},
		{"addr bogus", func(t *testing.T) []string { return []string{"serve", "--addr", "bogus"} },
			ExitUsage, `^idem serve: --addr "bogus": want host:port`, ""},
		{"addr port out of range", func(t *testing.T) []string { return []string{"serve", "--addr", "127.0.0.1:99999"} },
			ExitUsage, `^idem serve: --addr "127\.0\.0\.1:99999": the port must be a number from 0 to 65535$`, ""},
		{"metrics-addr bogus", func(t *testing.T) []string { return []string{"serve", "--metrics-addr", "bogus"} },
			ExitUsage, `^idem serve: --metrics-addr "bogus": want host:port`, ""},
		{"metrics-addr on the API's", func(t *testing.T) []string {
			return []string{"serve", "--addr", "127.0.0.1:3999", "--metrics-addr", "127.0.0.1:3999"}
		}, ExitUsage, `^idem serve: --metrics-addr "127\.0\.0\.1:3999" is --addr's address`, "listening"},
		{"keys unreachable", func(t *testing.T) []string {
			return []string{"serve", "--addr", "127.0.0.1:0", "--keys", "redis://127.0.0.1:1/0"}
		},
			ExitFailure, `^idem serve: cannot reach Redis at 127\.0\.0\.1:1: `, ""},
		{"keys database out of range", func(t *testing.T) []string {
			u, err := url.Parse(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/99"
			return []string{"serve", "--addr", "127.0.0.1:0", "--keys", u.String()}
		}, ExitFailure, `^idem serve: --keys: Redis at \S+ has no database 99 \(out of range`, "cannot reach"},
		{"flag typo", func(t *testing.T) []string { return []string{"serve", "--adr", "127.0.0.1:0"} },
			ExitUsage, `^idem serve: unknown flag --adr; did you mean --addr\?`, ""},
		{"command typo", func(t *testing.T) []string { return []string{"inspekt"} },
			ExitUsage, `^idem: unknown command "inspekt"; did you mean "inspect"\?`, ""},
		{"inspect unmigrated", func(t *testing.T) []string {
			return []string{"inspect", "--key", "k", "--db", testenv.PostgresSchema(t)}
		}, ExitFailure, `^idem inspect: read the record: .*idem_keys.*run "idem migrate`, ""},
		{"purge unmigrated", func(t *testing.T) []string {
			path := filepath.Join(t.TempDir(), "empty.db")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"purge", "--db", "sqlite:" + path}
		}, ExitFailure, `^idem purge: .*no such table.*run "idem migrate`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			code, out, errOut := runIdem(t, dir, c.args(t)...)
			line := strings.TrimSuffix(errOut, "\n")
			if code != c.code || strings.Contains(line, "\n") || !regexp.MustCompile(c.want).MatchString(line) ||
				(c.never != "" && strings.Contains(errOut, c.never)) {
				t.Errorf("exit %d, stderr %q; want exit %d and one line matching %s (never %q)", code, errOut, c.code, c.want, c.never)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			// Nothing created: serve's default --db is sqlite:idem.db in
			// the working directory.
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("left behind: %v", entries)
			}
		})
	}
}

// TestVersionFlag: idem --version is idem version.
func TestVersionFlag(t *testing.T) {
	code, out, errOut := runIdem(t, t.TempDir(), "--version")
	if code != ExitOK || !strings.HasPrefix(out, "idem ") || errOut != "" {
		t.Fatalf("idem --version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestSuggest(t *testing.T) {
	names := []string{"addr", "db", "keys", "lease", "metrics-addr", "read-timeout", "write-timeout"}
	for typed, want := range map[string]string{
		"adr": "addr", "metric-addr": "metrics-addr", "metrics": "metrics-addr", "kes": "keys",
		"write-timout": "write-timeout", "zzz": "", "d": "", "timeout": "",
	} {
		if got := suggest(typed, names); got != want {
			t.Errorf("suggest(%q) = %q, want %q", typed, got, want)
		}
	}
}
