package idemcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/internal/fieldtext"
	"github.com/idem-go/idem/internal/testenv"
)

// inspectFixture writes three records of tenant through store: one
// complete (with headers and a body holding a newline and a quote), one
// in flight under a live lease, one past its retention.
func inspectFixture(t *testing.T, store idem.Store, tenant string) {
	t.Helper()
	ctx := context.Background()
	claim := func(key string, token int64, lease, retention time.Duration) {
		t.Helper()
		res, err := store.Claim(ctx, idem.ClaimParams{
			Tenant: tenant, Key: key, Fingerprint: []byte{0xab, 0xcd}, Token: token, Lease: lease, Retention: retention,
		})
		if err != nil || !res.Won {
			t.Fatalf("claim %s: %+v %v", key, res, err)
		}
	}
	claim("done", 7, time.Minute, time.Hour)
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: "done", Token: 7, Result: idem.Result{
		Status: 201,
		Header: map[string][]string{"Location": {"/orders/ord_1"}, "Content-Type": {"application/json"}},
		Body:   []byte("{\"id\":\"ord_1\",\n\"note\":\"a \\\"quote\\\"\"}"),
	}}); err != nil {
		t.Fatal(err)
	}
	claim("running", 3, time.Hour, time.Hour)
	claim("old", 1, time.Millisecond, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // past the short retention on every clock
}

// TestInspectCommand: inspect prints each state as the stores keep it,
// in text and JSON, and a key without a record is one line and exit 1.
func TestInspectCommand(t *testing.T) {
	for _, kind := range inspectKinds {
		t.Run(kind.name, func(t *testing.T) {
			tenant := "acme"
			if kind.fresh == nil {
				// The Redis server is shared by every test: the records of
				// this one carry a tenant of their own.
				tenant = testenv.Name()
			}
			store, where := openInspectStore(t, kind.fresh, tenant, "done", "running", "old")
			inspectFixture(t, store, tenant)
			inspect := func(args ...string) (int, string, string) {
				return run(append(append([]string{"inspect", "--tenant", tenant}, where...), args...)...)
			}

			code, out, errOut := inspect("--key", "done")
			if code != ExitOK || errOut != "" {
				t.Fatalf("inspect done: exit %d, stderr %q", code, errOut)
			}
			for _, want := range []string{
				"state         complete (retries with the same request get the stored answer)\n",
				"fingerprint   sha256:abcd\n",
				"lease token   7\n",
				"answer        201, stored as response\n",
				"header        Content-Type: \"application/json\"\n",
				"              Location: \"/orders/ord_1\"\n",
				`body          "{\"id\":\"ord_1\",\n\"note\":\"a \\\"quote\\\"\"}" (36 bytes)` + "\n",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("inspect done: no line %q in\n%s", want, out)
				}
			}

			code, out, _ = inspect("--key", "running")
			if code != ExitOK || !strings.Contains(out, "state         in flight (retries get 409") || strings.Contains(out, "(ended)") {
				t.Errorf("inspect running: exit %d\n%s", code, out)
			}
			// A record past retention counts as absent. The SQL stores keep
			// it until a purge; Redis deletes it at once (its TTL).
			code, out, _ = inspect("--key", "old")
			if kind.fresh == nil {
				if code != ExitFailure {
					t.Errorf("inspect old on Redis: exit %d, want %d (deleted by its TTL)\n%s", code, ExitFailure, out)
				}
			} else if code != ExitOK || !strings.Contains(out, "state         expired (stored in_flight, past retention") {
				t.Errorf("inspect old: exit %d\n%s", code, out)
			}

			code, out, _ = inspect("--key", "done", "--json")
			var v recordView
			if err := json.Unmarshal([]byte(out), &v); code != ExitOK || err != nil {
				t.Fatalf("inspect --json: exit %d, %v\n%s", code, err, out)
			}
			if v.State != "complete" || v.Status != 201 || v.Body == nil || !strings.HasPrefix(*v.Body, "{\"id\":\"ord_1\",\n") ||
				v.BodySize != 36 || v.LeaseToken != 7 || v.Fingerprint != "abcd" || v.CompletedAt == nil ||
				v.Header["Location"][0] != "/orders/ord_1" || v.Tenant != tenant || v.Key != "done" {
				t.Errorf("inspect --json: %+v", v)
			}

			code, out, errOut = inspect("--key", "never")
			if code != ExitFailure || out != "" || strings.Count(errOut, "\n") != 1 ||
				!strings.HasPrefix(errOut, `idem inspect: no record for key "never" under tenant "`+tenant+`"`) {
				t.Errorf("inspect of an unused key: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			// The same key under another tenant is another key.
			if code, _, _ := run(append(append([]string{"inspect", "--tenant", "other"}, where...), "--key", "done")...); code != ExitFailure {
				t.Errorf("inspect under another tenant: exit %d, want %d", code, ExitFailure)
			}
		})
	}
}

func TestInspectBadInput(t *testing.T) {
	db := sqliteDB(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", "--db", db}, ExitUsage, "idem inspect: --key is required\n"},
		{[]string{"inspect", "--db", db, "--key", strings.Repeat("k", 256)}, ExitUsage, "idem inspect: --key: "},
		{[]string{"inspect", "--db", db, "--key", "tab\there"}, ExitUsage, "idem inspect: --key: "},
		{[]string{"inspect", "--db", db, "--key", "k"}, ExitFailure, "idem inspect: SQLite file "},
		{[]string{"inspect", "--keys", "http://x", "--key", "k"}, ExitUsage, "idem inspect: --keys "},
		{[]string{"inspect", "--key", "k", "extra"}, ExitUsage, "idem inspect: unexpected argument \"extra\""},
		{[]string{"inspect", "--db", db, "--key", "k", "--tenant", "t", "--consumer", "c"}, ExitUsage, "idem inspect: --tenant and --consumer both name the tenant; give one"},
	} {
		code, out, errOut := run(tc.args...)
		if code != tc.code || out != "" || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("idem %s: exit %d, stdout %q, stderr %q; want exit %d and one line starting %q",
				strings.Join(tc.args[1:], " "), code, out, errOut, tc.code, tc.want)
		}
	}
}

// inspectKinds are the stores inspect reads: the databases, and Redis.
var inspectKinds = append(dbKinds[:len(dbKinds):len(dbKinds)], struct {
	name  string
	fresh func(t *testing.T) string
}{"redis", nil})

// openInspectStore opens a fresh store of the kind and returns it with
// the flags that point inspect at it. Redis is shared: its records are
// deleted when the test ends, for the keys given.
func openInspectStore(t *testing.T, fresh func(t *testing.T) string, tenant string, keys ...string) (idem.Store, []string) {
	t.Helper()
	ctx := context.Background()
	if fresh == nil {
		url := testenv.RedisURL(t)
		cn := &conn{}
		t.Cleanup(func() { cn.Close() })
		rs, err := cn.useRedis(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, k := range keys {
				cn.rdb.Del(ctx, fmt.Sprintf("%s:{%d:%s:%s}", idemredis.DefaultPrefix, len(tenant), tenant, k))
			}
		})
		return rs, []string{"--keys", url, "--db", "sqlite:/nonexistent/never-opened.db"}
	}
	db := fresh(t)
	if code, _, errOut := run("migrate", "--db", db); code != ExitOK {
		t.Fatalf("migrate: %s", errOut)
	}
	cn, err := openDB(ctx, db, openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cn.Close() })
	return testenv.Must(cn.keyStore()), []string{"--db", db}
}

// TestInspectEscapes: whatever a record holds that came from a client or
// a server (tenant, key, reference, body) is printed escaped: no control
// character, C1 included, reaches the terminal, in text or JSON. The
// tenant of an ideminbox consumer, "\x1finbox:<name>", is found with
// --consumer and shown escaped.
func TestInspectEscapes(t *testing.T) {
	for _, kind := range inspectKinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			consumer := testenv.Name() + "\u009b2J"
			tenant := ideminbox.Tenant(consumer)
			store, where := openInspectStore(t, kind.fresh, tenant, "ref", "body", ideminbox.Key(strings.Repeat("m", 300)))
			complete := func(key string, res idem.Result) {
				t.Helper()
				if _, err := store.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key, Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil {
					t.Fatal(err)
				}
				tx, err := store.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: 1, Result: res}); err != nil {
					t.Fatal(err)
				}
			}
			complete("ref", idem.Result{Mode: idem.ModeReference, Status: 201, Reference: "ord\x1b[2J\u009b2J\u009d0;t\a\x7f"})
			complete("body", idem.Result{Status: 200, Header: map[string][]string{"X-Note": {"tab\there"}},
				Body: []byte("{\"a\":\"\x1b]0;pwned\a\u009d0;x\u009c\u0085\"}")})

			for _, args := range [][]string{
				{"--key", "ref"}, {"--key", "ref", "--json"},
				{"--key", "body"}, {"--key", "body", "--json"}, {"--key", "body", "--full-body"},
			} {
				code, out, errOut := run(append(append([]string{"inspect", "--consumer", consumer}, where...), args...)...)
				if code != ExitOK || errOut != "" {
					t.Fatalf("inspect %s: exit %d, stderr %q", args, code, errOut)
				}
				for _, r := range strings.TrimSuffix(out, "\n") {
					if fieldtext.IsCTL(r) && r != '\n' {
						t.Fatalf("inspect %s prints the control character %U:\n%s", args, r, out)
					}
				}
				if !strings.Contains(out, `\u001finbox:`) && !strings.Contains(out, `\x1finbox:`) {
					t.Errorf("inspect %s does not show the tenant escaped:\n%s", args, out)
				}
				if args[1] == "body" && !strings.Contains(strings.Join(args, " "), "--json") && !strings.Contains(out, `X-Note: "tab\there"`) {
					t.Errorf("inspect %s does not show the header value quoted:\n%s", args, out)
				}
				if !strings.Contains(out, `\u009b2J`) {
					t.Errorf("inspect %s does not show the C1 control escaped:\n%s", args, out)
				}
				if strings.Contains(strings.Join(args, " "), "--json") {
					var v recordView
					if err := json.Unmarshal([]byte(out), &v); err != nil || v.Tenant != tenant {
						t.Errorf("inspect %s: the JSON reads back as tenant %q (%v), want %q", args, v.Tenant, err, tenant)
					}
				}
			}
			// A message id that is not a valid key is looked up hashed, as
			// the inbox keeps it.
			longID := strings.Repeat("m", 300)
			complete(ideminbox.Key(longID), idem.Result{Status: 200})
			if code, out, errOut := run(append(append([]string{"inspect", "--consumer", consumer}, where...), "--key", longID)...); code != ExitOK || !strings.Contains(out, `"sha256:`) {
				t.Errorf("inspect --consumer of a long message id: exit %d, stderr %q\n%s", code, errOut, out)
			}
			code, _, errOut := run(append(append([]string{"inspect", "--consumer", consumer + "x"}, where...), "--key", "ref")...)
			if code != ExitFailure || !strings.Contains(errOut, `under tenant "\x1finbox:`) || strings.ContainsFunc(strings.TrimSuffix(errOut, "\n"), fieldtext.IsCTL) {
				t.Errorf("inspect of another consumer: exit %d, stderr %q", code, errOut)
			}
		})
	}
}
