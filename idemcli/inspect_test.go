package idemcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
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
	kinds := append(dbKinds, struct {
		name  string
		fresh func(t *testing.T) string
	}{"redis", nil})
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			var where []string
			var store idem.Store
			tenant := "acme"
			if kind.fresh == nil {
				url := testenv.RedisURL(t)
				cn := &conn{}
				t.Cleanup(func() { cn.Close() })
				rs, err := cn.useRedis(ctx, url, nil)
				if err != nil {
					t.Fatal(err)
				}
				store = rs
				// The server is shared by every test: the records of this
				// one carry a tenant of their own, deleted at the end.
				tenant = testenv.Name()
				t.Cleanup(func() {
					for _, k := range []string{"done", "running", "old"} {
						cn.rdb.Del(ctx, fmt.Sprintf("%s:{%d:%s:%s}", idemredis.DefaultPrefix, len(tenant), tenant, k))
					}
				})
				where = []string{"--keys", url, "--db", "sqlite:/nonexistent/never-opened.db"}
			} else {
				db := kind.fresh(t)
				if code, _, errOut := run("migrate", "--db", db); code != ExitOK {
					t.Fatalf("migrate: %s", errOut)
				}
				cn, err := openDB(ctx, db, openOptions{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cn.Close() })
				store = cn.keyStore()
				where = []string{"--db", db}
			}
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
				"header        Content-Type: application/json\n",
				"              Location: /orders/ord_1\n",
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
	} {
		code, out, errOut := run(tc.args...)
		if code != tc.code || out != "" || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("idem %s: exit %d, stdout %q, stderr %q; want exit %d and one line starting %q",
				strings.Join(tc.args[1:], " "), code, out, errOut, tc.code, tc.want)
		}
	}
}
