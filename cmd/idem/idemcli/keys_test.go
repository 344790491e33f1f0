package idemcli

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/safetext"
	"github.com/idem-go/idem/internal/testenv"
)

// TestKeysCommands lists, releases and forgets keys with `idem keys` on
// each database, records written by the store itself.
func TestKeysCommands(t *testing.T) {
	for _, kind := range dbKinds {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.fresh(t)
			if code, _, errOut := run("migrate", "--db", db); code != ExitOK {
				t.Fatalf("migrate: %d %s", code, errOut)
			}
			ctx := context.Background()
			cn, err := openDB(ctx, db, openOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer cn.Close()
			st, err := cn.keyStore()
			if err != nil {
				t.Fatal(err)
			}
			tenant := "keys-cli-" + kind.name
			claimKey := func(key string, token int64, complete bool) {
				t.Helper()
				if _, err := st.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key, Token: token, Lease: time.Minute, Retention: time.Hour}); err != nil {
					t.Fatal(err)
				}
				if complete {
					u, _ := st.Begin(ctx)
					if err := u.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: token, Result: idem.Result{Status: 201}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			claimKey("stuck", 11, false)
			claimKey("done", 12, true)
			claimKey("esc\x1b[2J", 13, true)
			// A key that a terminal would draw as another: bidirectional
			// controls (an override, an isolate) and a zero-width space.
			const bidi = "bidi\u202eevil\u2066x\u2069\u200b"
			claimKey(bidi, 14, true)

			code, out, errOut := run("keys", "list", "--db", db, "--tenant", tenant)
			if code != ExitOK || !strings.Contains(out, `"stuck"`) || !strings.Contains(out, "in_flight") || !strings.Contains(out, `"esc\x1b[2J"`) {
				t.Fatalf("keys list: %d\n%s%s", code, out, errOut)
			}
			if strings.Contains(out, "\x1b") {
				t.Errorf("keys list printed a raw escape:\n%q", out)
			}
			if !strings.Contains(out, `"bidi\u202eevil\u2066x\u2069\u200b"`) || strings.ContainsFunc(out, safetext.IsInvisible) {
				t.Errorf("keys list did not escape the invisible characters of a key:\n%q", out)
			}
			code, out, _ = run("keys", "list", "--db", db, "--tenant", tenant, "--state", "complete", "--json")
			var page struct {
				Keys []struct {
					Key    string `json:"key"`
					Status string `json:"status"`
				} `json:"keys"`
			}
			if code != ExitOK || json.Unmarshal([]byte(out), &page) != nil || len(page.Keys) != 3 || page.Keys[0].Status != "complete" {
				t.Fatalf("keys list --state complete --json: %d %+v\n%s", code, page, out)
			}
			// The JSON is the same data, its invisible characters written as
			// \u escapes: a terminal shows them, a program reads the key.
			if strings.ContainsFunc(out, safetext.IsInvisible) || !strings.Contains(out, `bidi\u202eevil\u2066x\u2069\u200b`) ||
				!slices.ContainsFunc(page.Keys, func(k struct {
					Key    string `json:"key"`
					Status string `json:"status"`
				}) bool {
					return k.Key == bidi
				}) {
				t.Errorf("keys list --json: the bidi key raw, or not read back as it is:\n%q", out)
			}
			code, out, errOut = run("keys", "forget", "--db", db, "--tenant", tenant, "--key", bidi, "--reason", "test")
			if code != ExitOK || !strings.Contains(out, `"bidi\u202eevil\u2066x\u2069\u200b": forgotten`) || strings.ContainsFunc(out+errOut, safetext.IsInvisible) {
				t.Errorf("keys forget of the bidi key: %d %q %q", code, out, errOut)
			}
			if code, _, errOut := run("keys", "list", "--db", db, "--state", "stuck"); code != ExitUsage || strings.Count(errOut, "\n") != 1 {
				t.Errorf("keys list --state stuck: %d %q, want a one-line usage error", code, errOut)
			}

			if code, _, errOut := run("keys", "release", "--db", db, "--tenant", tenant, "--key", "stuck"); code != ExitUsage || !strings.Contains(errOut, "--reason") {
				t.Errorf("keys release without --reason: %d %q", code, errOut)
			}
			if code, _, errOut := run("keys", "release", "--db", db, "--tenant", tenant, "--key", "done", "--reason", "test"); code != ExitFailure || !strings.Contains(errOut, "not in flight") || strings.Count(errOut, "\n") != 1 {
				t.Errorf("keys release of a complete key: %d %q", code, errOut)
			}
			code, out, errOut = run("keys", "release", "--db", db, "--tenant", tenant, "--key", "stuck", "--reason", "holder dead", "--token", "11")
			if code != ExitOK || !strings.Contains(out, "released") {
				t.Fatalf("keys release: %d %s%s", code, out, errOut)
			}
			if !strings.Contains(errOut, `reason="holder dead"`) {
				t.Errorf("the release is not logged with its reason: %s", errOut)
			}
			if _, err := st.Get(ctx, tenant, "stuck"); err == nil {
				t.Error("the released key is still there")
			}
			code, out, errOut = run("keys", "forget", "--db", db, "--tenant", tenant, "--key", "done", "--reason", "customer asked to run it again")
			if code != ExitOK || !strings.Contains(out, "forgotten") {
				t.Fatalf("keys forget: %d %s%s", code, out, errOut)
			}
			if _, err := st.Get(ctx, tenant, "done"); err == nil {
				t.Error("the forgotten key is still there")
			}
			if code, _, errOut := run("keys", "forget", "--db", db, "--tenant", tenant, "--key", "done", "--reason", "again"); code != ExitFailure || !strings.Contains(errOut, "no record") {
				t.Errorf("keys forget of an absent key: %d %q", code, errOut)
			}
		})
	}
}

func TestKeysAndConsoleHelp(t *testing.T) {
	for cmd, names := range map[string][]string{
		"console": {"db", "keys", "addr", "token", "lease"},
	} {
		code, out, _ := run(cmd, "--help")
		if code != ExitOK {
			t.Fatalf("idem %s --help: exit %d", cmd, code)
		}
		for _, name := range names {
			if !strings.Contains(out, "  --"+name) {
				t.Errorf("idem %s --help does not explain --%s", cmd, name)
			}
		}
	}
	if code, _, errOut := run("console", "--db", "sqlite:/nonexistent"); code != ExitUsage || !strings.Contains(errOut, "--token") {
		t.Errorf("idem console without a token: %d %q", code, errOut)
	}
}

// TestKeysCommandsOnRedis runs idem keys on records kept in Redis, under a
// tenant of its own (the CLI uses the default prefix).
func TestKeysCommandsOnRedis(t *testing.T) {
	rawURL := testenv.RedisURL(t)
	ctx := context.Background()
	cn := &conn{}
	defer cn.Close()
	st, err := cn.useRedis(ctx, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	tenant := testenv.Name()
	for i, key := range []string{"stuck", "done"} {
		token := int64(20 + i)
		if _, err := st.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key, Token: token, Lease: time.Minute, Retention: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if key == "done" {
			u, _ := st.Begin(ctx)
			if err := u.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: token, Result: idem.Result{Status: 201}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	code, out, errOut := run("keys", "list", "--keys", rawURL, "--tenant", tenant)
	if code != ExitOK || !strings.Contains(out, `"stuck"`) || !strings.Contains(out, `"done"`) {
		t.Fatalf("keys list on Redis: %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := run("keys", "release", "--keys", rawURL, "--tenant", tenant, "--key", "stuck", "--reason", "test"); code != ExitOK || !strings.Contains(out, "released") {
		t.Fatalf("keys release on Redis: %d %s%s", code, out, errOut)
	}
	if code, out, errOut := run("keys", "forget", "--keys", rawURL, "--tenant", tenant, "--key", "done", "--reason", "test"); code != ExitOK || !strings.Contains(out, "forgotten") {
		t.Fatalf("keys forget on Redis: %d %s%s", code, out, errOut)
	}
	if code, out, _ := run("keys", "list", "--keys", rawURL, "--tenant", tenant); code != ExitOK || strings.Contains(out, `"stuck"`) || strings.Contains(out, `"done"`) {
		t.Errorf("keys list after release and forget: %d\n%s", code, out)
	}
}
