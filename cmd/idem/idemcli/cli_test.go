package idemcli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// run calls Main in-process and returns its status and streams.
// A command that should have failed but serves instead stops when its
// context ends, a minute later, and the test then fails on its exit
// status rather than hanging.
func run(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := Main(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestMainHelp(t *testing.T) {
	code, out, _ := run("--help")
	if code != ExitOK {
		t.Fatalf("idem --help: exit %d", code)
	}
	for _, c := range commands() {
		if !strings.Contains(out, "  "+c.name+" ") {
			t.Errorf("idem --help does not list %s:\n%s", c.name, out)
		}
	}
	if code, _, errOut := run(); code != ExitUsage || !strings.Contains(errOut, "Usage:") {
		t.Fatalf("idem without a command: exit %d, stderr %q", code, errOut)
	}
}

// TestCheckIsWired: `idem check` is idemcheck.Main, with its own help and
// exit statuses.
func TestCheckIsWired(t *testing.T) {
	if code, out, _ := run("check", "--help"); code != ExitOK || !strings.Contains(out, "count-url") {
		t.Fatalf("idem check --help: exit %d, stdout %q", code, out)
	}
	if code, _, errOut := run("check"); code != ExitUsage || !strings.HasPrefix(errOut, "idem check: missing URL") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("idem check without a URL: exit %d, stderr %q", code, errOut)
	}
}

func TestCommandHelpListsEveryFlag(t *testing.T) {
	flags := map[string][]string{
		"serve":   {"addr", "db", "keys", "lease", "retention", "require-key", "handler-delay", "wait-in-flight", "purge-interval", "read-timeout", "write-timeout", "idle-timeout"},
		"migrate": {"db", "dry-run"},
		"purge":   {"db", "batch"},
		"inspect": {"key", "tenant", "consumer", "db", "keys", "json", "full-body"},
	}
	for cmd, names := range flags {
		code, out, errOut := run(cmd, "--help")
		if code != ExitOK || errOut != "" {
			t.Fatalf("idem %s --help: exit %d, stderr %q", cmd, code, errOut)
		}
		for _, name := range names {
			if !strings.Contains(out, "  --"+name) {
				t.Errorf("idem %s --help does not explain --%s:\n%s", cmd, name, out)
			}
		}
	}
	if !strings.Contains(mustRunHelp(t, "serve"), "(default 127.0.0.1:3000)") {
		t.Error("idem serve --help does not give the default address")
	}
}

func mustRunHelp(t *testing.T, cmd string) string {
	_, out, _ := run(cmd, "--help")
	return out
}

// TestBadInput: every bad command line exits non-zero with one readable
// line on stderr, and starts nothing.
func TestBadInput(t *testing.T) {
	db := "sqlite:" + filepath.Join(t.TempDir(), "x.db")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nope"}, ExitUsage, `unknown command "nope"`},
		{[]string{"serve", "--lease", "abc"}, ExitUsage, "--lease"},
		{[]string{"serve", "--lease", "-1s", "--db", db}, ExitUsage, "--lease must be positive"},
		{[]string{"serve", "--lease", "1ms", "--db", db}, ExitUsage, "--lease must be at least 10ms"},
		{[]string{"serve", "--purge-interval", "1ns", "--db", db}, ExitUsage, "--purge-interval must be 0 (off) or at least 10ms"},
		{[]string{"serve", "--retention", "0s", "--db", db}, ExitUsage, "--retention must be positive"},
		{[]string{"serve", "--handler-delay", "-1s", "--db", db}, ExitUsage, "--handler-delay"},
		{[]string{"serve", "--wait-in-flight", "-1s", "--db", db}, ExitUsage, "--wait-in-flight must not be negative"},
		{[]string{"serve", "--write-timeout", "10s", "--read-timeout", "5s", "--wait-in-flight", "5s", "--db", db}, ExitUsage, "--wait-in-flight 5s; make it longer"},
		{[]string{"serve", "--lease", "2m", "--retention", "1m", "--db", db}, ExitUsage, "--retention 1m0s is shorter than --lease 2m0s"},
		{[]string{"serve", "--retention", "1s", "--db", db}, ExitUsage, "--retention 1s is shorter than --lease 1m30s"},
		{[]string{"serve", "--read-timeout", "0s", "--db", db}, ExitUsage, "--read-timeout must be at least 10ms"},
		{[]string{"serve", "--idle-timeout", "1ms", "--db", db}, ExitUsage, "--idle-timeout must be at least 10ms"},
		{[]string{"serve", "--write-timeout", "0s", "--db", db}, ExitUsage, "--write-timeout must be positive"},
		{[]string{"serve", "--write-timeout", "10s", "--read-timeout", "5s", "--handler-delay", "5s", "--db", db}, ExitUsage, "--write-timeout 10s leaves no time to answer"},
		{[]string{"serve", "--db", "postgres://u:p/w@127.0.0.1:5432/test"}, ExitUsage, "percent-encode"},
		{[]string{"serve", "--db", "postgres://u:p%zz@127.0.0.1:5432/test"}, ExitUsage, "%25"},
		{[]string{"serve", "--db", "mysql://u:p#w@127.0.0.1:3306/test"}, ExitUsage, "%23"},
		{[]string{"serve", "--db", db, "--keys", "redis://:p?w@127.0.0.1:6379/0"}, ExitUsage, "percent-encode"},
		{[]string{"serve", strings.Repeat("x", 5000)}, ExitUsage, `"… (run "idem serve --help")`},
		{[]string{"\x1b]0;pwned\a"}, ExitUsage, `unknown command "\x1b]0;pwned\a"`},
		{[]string{"serve", "--no-such-flag"}, ExitUsage, "no-such-flag"},
		{[]string{"serve", "--db", db, "extra"}, ExitUsage, `unexpected argument "extra"`},
		{[]string{"serve", "--db", "oracle://scott@db/x"}, ExitUsage, "unknown form"},
		{[]string{"serve", "--db", "sqlite:"}, ExitUsage, "path is empty"},
		{[]string{"serve", "--db", "mysql://root@127.0.0.1:3306/"}, ExitUsage, "needs a database name"},
		{[]string{"serve", "--db", "mysql://root@127.0.0.1:3306/test?nosuch=1&tls=maybe"}, ExitUsage, "--db"},
		{[]string{"serve", "--db", db, "--keys", "http://127.0.0.1:6379"}, ExitUsage, "--keys"},
		{[]string{"purge", "--batch", "0", "--db", db}, ExitUsage, "--batch must be positive"},
		{[]string{"migrate", "--db", "postgres://postgres:s3cret@127.0.0.1:1/test?connect_timeout=5"}, ExitFailure, "cannot reach"},
		{[]string{"purge", "--db", "sqlite:" + filepath.Join(t.TempDir(), "missing.db")}, ExitFailure, "does not exist"},
		{[]string{"migrate", "--dry-run", "--db", "sqlite:" + filepath.Join(t.TempDir(), "missing.db")}, ExitFailure, "does not exist"},
	}
	for _, c := range cases {
		code, out, errOut := run(c.args...)
		if code != c.code {
			t.Errorf("idem %s: exit %d, want %d (stderr %q)", strings.Join(c.args, " "), code, c.code, errOut)
		}
		if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "idem") || !strings.Contains(errOut, c.want) {
			t.Errorf("idem %s: stderr %q, want one line saying %q", strings.Join(c.args, " "), errOut, c.want)
		}
		if len(errOut) > 400 {
			t.Errorf("idem %s: a %d-byte error line", strings.Join(c.args, " "), len(errOut))
		}
		if strings.Contains(errOut, "s3cret") {
			t.Errorf("idem %s: the password shows on stderr: %q", strings.Join(c.args, " "), errOut)
		}
		if out != "" {
			t.Errorf("idem %s: stdout %q, want nothing", strings.Join(c.args, " "), out)
		}
	}
}

func TestParseDB(t *testing.T) {
	for _, c := range []struct {
		in   string
		want dbTarget
	}{
		{"sqlite:idem.db", dbTarget{dialect: dialectSQLite, path: "idem.db"}},
		{"sqlite:///tmp/x.db", dbTarget{dialect: dialectSQLite, path: "/tmp/x.db"}},
		{"postgres://postgres@127.0.0.1:5432/test", dbTarget{dialect: dialectPostgres, url: "postgres://postgres@127.0.0.1:5432/test"}},
		{"mysql://root@127.0.0.1:3306/test", dbTarget{dialect: dialectMySQL, dsn: "root@tcp(127.0.0.1:3306)/test?parseTime=true"}},
		{"mysql://u:p%40ss@db.local/shop", dbTarget{dialect: dialectMySQL, dsn: "u:p@ss@tcp(db.local:3306)/shop?parseTime=true"}},
		{"mysql://root@127.0.0.1:3306/test?timeout=5s", dbTarget{dialect: dialectMySQL, dsn: "root@tcp(127.0.0.1:3306)/test?parseTime=true&timeout=5s"}},
	} {
		got, err := parseDB(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseDB(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

// TestMigrateCommand: --dry-run lists what migrate then applies, and
// changes nothing; a second migrate has nothing to do.
func TestMigrateCommand(t *testing.T) {
	for _, kind := range dbKinds {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.fresh(t)
			if kind.name == "sqlite" {
				// --dry-run refuses to create the file it inspects.
				if err := os.WriteFile(strings.TrimPrefix(db, "sqlite:"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			code, pending, errOut := run("migrate", "--dry-run", "--db", db)
			if code != ExitOK || !strings.HasPrefix(pending, "pending: 0001_") {
				t.Fatalf("dry run: exit %d, stdout %q, stderr %q", code, pending, errOut)
			}
			if code, again, _ := run("migrate", "--dry-run", "--db", db); code != ExitOK || again != pending {
				t.Fatalf("a second dry run printed %q, want %q: the first one changed something", again, pending)
			}
			code, applied, errOut := run("migrate", "--db", db)
			if code != ExitOK || applied != strings.ReplaceAll(pending, "pending: ", "applied: ") {
				t.Fatalf("migrate: exit %d, stdout %q (pending was %q), stderr %q", code, applied, pending, errOut)
			}
			for _, args := range [][]string{{"migrate", "--db", db}, {"migrate", "--dry-run", "--db", db}} {
				if code, out, _ := run(args...); code != ExitOK || out != "up to date\n" {
					t.Fatalf("idem %s after migrating: exit %d, stdout %q", strings.Join(args, " "), code, out)
				}
			}
		})
	}
}

// TestPurgeCommand: purge deletes the records past retention, in batches,
// and keeps the others.
func TestPurgeCommand(t *testing.T) {
	for _, kind := range dbKinds {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.fresh(t)
			if code, _, errOut := run("migrate", "--db", db); code != ExitOK {
				t.Fatalf("migrate: %s", errOut)
			}
			cn, err := openDB(context.Background(), db, openOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer cn.Close()
			store := testenv.Must(cn.keyStore())
			claim := func(key string, retention time.Duration) {
				t.Helper()
				_, err := store.Claim(context.Background(), idem.ClaimParams{
					Tenant: "t", Key: key, Token: 1, Lease: time.Millisecond, Retention: retention,
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			for i := range 5 {
				claim("old-"+string(rune('a'+i)), time.Millisecond)
			}
			for i := range 3 {
				claim("live-"+string(rune('a'+i)), time.Hour)
			}
			time.Sleep(50 * time.Millisecond) // let the short retention pass on the database's clock

			code, out, errOut := run("purge", "--db", db, "--batch", "2")
			if code != ExitOK || out != "purged 5 expired records\n" {
				t.Fatalf("purge: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			for i := range 3 {
				if _, err := store.Get(context.Background(), "t", "live-"+string(rune('a'+i))); err != nil {
					t.Fatalf("a live record was purged: %v", err)
				}
			}
			if code, out, _ := run("purge", "--db", db); code != ExitOK || out != "purged 0 expired records\n" {
				t.Fatalf("second purge: exit %d, stdout %q", code, out)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	if code, out, _ := run("version"); code != ExitOK || !strings.HasPrefix(out, "idem ") {
		t.Fatalf("idem version: exit %d, %q", code, out)
	}
}

// TestRelativeSQLitePath: the default --db, sqlite:idem.db, is relative to
// the working directory.
func TestRelativeSQLitePath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if code, out, errOut := run("migrate"); code != ExitOK || !strings.HasPrefix(out, "applied: ") {
		t.Fatalf("idem migrate with the default --db: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "idem.db")); err != nil {
		t.Fatalf("the default database is not in the working directory: %v", err)
	}
}
