package idemcli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/internal/testenv"
)

// TestServeSingleTransaction: `idem serve --single-transaction` on
// PostgreSQL, MariaDB and SQLite. 20 duplicates released together while
// the first request runs get one order, the first answer and 19 replays,
// no 409; without --wait-in-flight, a duplicate gets 409 while the first
// runs.
func TestServeSingleTransaction(t *testing.T) {
	for name, db := range map[string]func(*testing.T) string{"postgres": postgresDB, "mysql": mysqlDB, "sqlite": sqliteDB} {
		t.Run(name, func(t *testing.T) { serveSingleTransaction(t, db(t)) })
	}
}

func serveSingleTransaction(t *testing.T, db string) {
	p := startServe(t, "idem serve", "--db", db, "--single-transaction", "--wait-in-flight", "5s", "--handler-delay", "300ms")
	key, cart := testenv.Name(), testenv.Name()
	body := fmt.Sprintf(`{"cart_id":%q,"total_cents":1900}`, cart)
	reqs := make([]Req, 20)
	for i := range reqs {
		reqs[i] = Req{Method: "POST", URL: p.url + "/orders", Body: body, Key: key}
	}
	answers := FireTogether(reqs)
	first := CheckOneEffect(t, answers)
	replays := 0
	for _, a := range answers {
		if a.Status == http.StatusCreated && a.Replayed() {
			replays++
		}
	}
	if replays != len(reqs)-1 {
		t.Fatalf("%d replays, want %d (every duplicate waits for the first answer); answers:\n%s", replays, len(reqs)-1, List(answers))
	}
	created := DecodeOrder(t, first)
	if got := ListOrders(t, p.url, cart); len(got) != 1 || got[0].ID != created.ID {
		t.Fatalf("orders for %s: %+v, want exactly %s", cart, got, created.ID)
	}
	p.stop()

	// Without a wait, a duplicate of a request in flight gets 409 at once.
	q := startServe(t, "idem serve", "--db", db, "--single-transaction", "--handler-delay", "1s")
	key = testenv.Name()
	for i := range 5 {
		reqs[i] = Req{Method: "POST", URL: q.url + "/orders", Body: body, Key: key}
	}
	answers = FireTogether(reqs[:5])
	fresh, conflicts := 0, 0
	for _, a := range answers {
		switch {
		case a.Status == http.StatusCreated && !a.Replayed():
			fresh++
		case a.Status == http.StatusConflict:
			conflicts++
		}
	}
	if fresh != 1 || conflicts != 4 {
		t.Fatalf("5 duplicates at once without --wait-in-flight: %d fresh, %d conflicts; want 1 and 4:\n%s", fresh, conflicts, List(answers))
	}
	q.stop()
}

// TestServeSingleTransactionRefused: the flag is refused where it cannot
// hold: records kept apart from the orders.
func TestServeSingleTransactionRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--db", sqliteDB(t), "--single-transaction", "--keys", "redis://127.0.0.1:6379/0"},
	} {
		var out bytes.Buffer
		code := Main(context.Background(), append([]string{"serve", "--addr", "127.0.0.1:0"}, args...), &out, &out)
		if code == 0 || !strings.Contains(out.String(), "--single-transaction") {
			t.Errorf("serve %v exited %d: %s; want a usage error naming --single-transaction", args, code, out.String())
		}
	}
}
