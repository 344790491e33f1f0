package idemcli

import (
	"fmt"
	"net/http"
	"testing"

	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/internal/testenv"
)

// TestServeWaitInFlight: with --wait-in-flight longer than
// --handler-delay, 20 duplicates released together get one order, the
// first answer and 19 replays of it, and no 409: on SQLite, PostgreSQL and
// MariaDB, and with the records in Redis (--keys).
func TestServeWaitInFlight(t *testing.T) {
	kinds := append(dbKinds[:len(dbKinds):len(dbKinds)], struct {
		name  string
		fresh func(t *testing.T) string
	}{"redis", nil})
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			args := []string{"--wait-in-flight", "2s", "--handler-delay", "500ms"}
			if kind.fresh != nil {
				args = append(args, "--db", kind.fresh(t))
			} else {
				args = append(args, "--db", sqliteDB(t), "--keys", testenv.RedisURL(t))
			}
			p := startServe(t, "idem serve", args...)
			// Unique in Redis, which every test shares.
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
		})
	}
}
