package idemdynamo_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/httpcheck"
)

// TestHTTPSameKeyAtTheSameInstant: two HTTP servers (two app instances,
// each with its own DynamoDB client) share one table on dynalite; 40
// identical POSTs with one key, released by one barrier and spread over
// both, run the handler exactly once. Every other answer is the
// byte-identical replay or a 409 in flight, and a retry after the
// completion gets the replay (httpcheck.SameKeyAtTheSameInstant).
func TestHTTPSameKeyAtTheSameInstant(t *testing.T) {
	endpoint := dynaliteEndpoint(t)
	table := newTable(t, endpoint)
	httpcheck.SameKeyAtTheSameInstant(t, 40, func(t testing.TB) *idem.Engine {
		return newEngine(t, newStore(t, endpoint, table, noSkew), nil)
	})
}

// TestHTTPBusinessItemsCommitWithAnswer: through idemhttp on minidyn, the
// handler adds its business write (a counter incremented by one) to the
// unit of work with idemdynamo.Tx(r.Context()); 30 duplicates released at
// one barrier over two servers increment it once, and every answer is
// the first or its replay or a 409.
func TestHTTPBusinessItemsCommitWithAnswer(t *testing.T) {
	endpoint := minidynEndpoint(t)
	table, orders := newTable(t, endpoint), newOrdersTable(t, endpoint)
	cfg := noSkew
	cfg.Transactional = true
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := increment(r.Context(), orders); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		time.Sleep(10 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	})
	servers, client := httpcheck.TwoInstances(t, func(t testing.TB) *idem.Engine {
		return newEngine(t, newStore(t, endpoint, table, cfg), nil)
	}, handler)
	const n = 30
	answers, _ := httpcheck.PostOrderAtOnce(servers, client, n)
	for i, a := range answers {
		if a.Status != http.StatusCreated && a.Status != http.StatusConflict {
			t.Fatalf("answer %d: status %d", i, a.Status)
		}
	}
	if got := counterValue(t, endpoint, orders); got != 1 {
		t.Fatalf("business counter = %d after %d duplicates, want 1", got, n)
	}
}
