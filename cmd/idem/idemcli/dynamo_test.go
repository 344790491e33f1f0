package idemcli

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/internal/testenv"
)

// TestServeDynamo: `idem migrate --db dynamodb://…` creates the table on
// dynalite (a DynamoDB-compatible server process); two `idem serve
// --keys dynamodb://…` processes share it, and 30 duplicates with one
// key, split over both and released together, make one order; `idem
// inspect` shows the record complete, and `idem purge` runs on it.
func TestServeDynamo(t *testing.T) {
	endpoint := testenv.Dynalite(t)
	keys := "dynamodb://" + testenv.Name() + "?endpoint=" + endpoint + "&region=us-east-1"
	ctx := context.Background()
	run := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := Main(ctx, args, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	if code, out := run("migrate", "--db", keys, "--dry-run"); code != 0 || !strings.Contains(out, "pending: create DynamoDB table") {
		t.Fatalf("migrate --dry-run: %d %s", code, out)
	}
	if code, out := run("migrate", "--db", keys); code != 0 || !strings.Contains(out, "applied: create DynamoDB table") {
		t.Fatalf("migrate: %d %s", code, out)
	}
	if code, out := run("migrate", "--db", keys); code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate again: %d %s", code, out)
	}

	// The orders of both processes in one SQLite file; the records in
	// DynamoDB.
	db := "sqlite:" + filepath.Join(t.TempDir(), "orders.db")
	a := startServe(t, "idem serve a", "--db", db, "--keys", keys, "--handler-delay", "100ms")
	b := startServe(t, "idem serve b", "--db", db, "--keys", keys, "--handler-delay", "100ms")
	reqs := make([]Req, 30)
	for i := range reqs {
		url := a.url
		if i%2 == 1 {
			url = b.url
		}
		reqs[i] = Req{Method: "POST", URL: url + "/orders", Body: GoodOrder, Key: "dynamo-key"}
	}
	first := CheckOneEffect(t, FireTogether(reqs))
	created := DecodeOrder(t, first)
	if got := ListOrders(t, a.url, "c_42"); len(got) != 1 || got[0].ID != created.ID {
		t.Fatalf("orders for c_42: %+v, want exactly %s", got, created.ID)
	}
	again := Do(t, Req{Method: "POST", URL: b.url + "/orders", Body: GoodOrder, Key: "dynamo-key"})
	if again.Status != http.StatusCreated || !again.Replayed() || string(again.Body) != string(first.Body) {
		t.Fatalf("late retry: %s replayed=%v, want the first answer replayed", again, again.Replayed())
	}
	a.stop()
	b.stop()

	if code, out := run("inspect", "--keys", keys, "--key", "dynamo-key"); code != 0 || !strings.Contains(out, "complete (retries") || !strings.Contains(out, created.ID) {
		t.Fatalf("inspect: %d %s", code, out)
	}
	if code, out := run("inspect", "--keys", keys, "--key", "never-used"); code != 1 || !strings.Contains(out, "no record") {
		t.Fatalf("inspect of a key never used: %d %s", code, out)
	}
	if code, out := run("purge", "--db", keys); code != 0 || !strings.Contains(out, "purged 0 expired records") {
		t.Fatalf("purge: %d %s", code, out)
	}
}

// TestDynamoURL: what a dynamodb:// value may say, and the one-line usage
// errors for the rest.
func TestDynamoURL(t *testing.T) {
	good, err := parseDynamoURL("dynamodb://idem_keys?region=eu-west-1&endpoint=http://127.0.0.1:8000&max-clock-skew=2s")
	if err != nil || good.table != "idem_keys" || good.region != "eu-west-1" || good.endpoint != "http://127.0.0.1:8000" || good.skew.String() != "2s" {
		t.Fatalf("parse: %+v, %v", good, err)
	}
	for _, bad := range []string{
		"dynamodb://",
		"dynamodb://ab",
		"dynamodb://t@ble",
		"dynamodb://idem_keys/extra",
		"dynamodb://idem_keys?endpoint=ftp://x",
		"dynamodb://idem_keys?max-clock-skew=soon",
		"dynamodb://idem_keys?colour=blue",
		"dynamodb://user:secret@idem_keys",
		"dynamodb://idem_keys?endpoint=http://user:secret@127.0.0.1:8000",
		"dynamodb://idem_keys?endpoint=http://127.0.0.1:8000/%zzsecret",
	} {
		_, err := parseDynamoURL(bad)
		if err == nil {
			t.Errorf("parseDynamoURL(%q) = nil error", bad)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("parseDynamoURL(%q) error shows the password: %v", bad, err)
		}
	}
}
