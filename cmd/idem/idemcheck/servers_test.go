package idemcheck_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

const orderBody = `{"cart_id":"c_42","total_cents":1900}`

type order struct {
	ID         int    `json:"id"`
	CartID     string `json:"cart_id"`
	TotalCents int    `json:"total_cents"`
}

// orders is the demo's orders API without any idempotency: POST /orders
// creates an order, GET /orders?cart_id=… lists them.
type orders struct {
	mu   sync.Mutex
	list []order
}

func (o *orders) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.list)
}

// create runs the business write and answers 201 with the new order.
func (o *orders) create(w http.ResponseWriter, r *http.Request) {
	var in order
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.CartID == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	in.ID = len(o.list) + 1
	o.list = append(o.list, in)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", in.ID))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(in)
}

func (o *orders) listHandler(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	out := []order{}
	for _, x := range o.list {
		if c := r.URL.Query().Get("cart_id"); c == "" || c == x.CartID {
			out = append(out, x)
		}
	}
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (o *orders) mux(post http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", post)
	mux.HandleFunc("GET /orders", o.listHandler)
	return mux
}

// raceWindow makes the check-then-write race of a naive server certain
// rather than likely: the first key the server is sent (check 1's, whose
// duplicates arrive together) keeps its first execution between the
// look-up and the write until a duplicate has looked the key up too, and
// found it absent. Without it the race depends on the scheduler, and a
// busy machine can serialize the duplicates.
type raceWindow struct {
	mu        sync.Mutex
	first     string
	looks     int
	duplicate chan struct{}
}

func newRaceWindow() *raceWindow { return &raceWindow{duplicate: make(chan struct{})} }

// looked records a look-up of key, before its result is acted on.
func (w *raceWindow) looked(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first == "" {
		w.first = key
	}
	if key == w.first {
		if w.looks++; w.looks == 2 {
			close(w.duplicate)
		}
	}
}

// work is the handler's work between look-up and write: for the first
// key, until a duplicate has looked too.
func (w *raceWindow) work(t testing.TB, key string) {
	w.mu.Lock()
	first := key == w.first
	w.mu.Unlock()
	if !first {
		return
	}
	select {
	case <-w.duplicate:
	case <-time.After(30 * time.Second):
		t.Error("no duplicate of the first key came")
	}
}

// naiveServer is the naive check-then-write race: it looks the key
// up, then works a little, then writes. Duplicates arriving together all
// find the key absent and all create an order.
func naiveServer(t *testing.T) (*httptest.Server, *orders) {
	t.Helper()
	o := &orders{}
	var mu sync.Mutex
	seen := map[string]*httptest.ResponseRecorder{}
	race := newRaceWindow()
	post := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		prev := seen[key] // check…
		race.looked(key)
		mu.Unlock()
		if prev != nil {
			w.Header().Set("Idempotent-Replayed", "true")
			for k, v := range prev.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(prev.Code)
			_, _ = w.Write(prev.Body.Bytes())
			return
		}
		race.work(t, key) // …some work…
		rec := httptest.NewRecorder()
		o.create(rec, r)
		mu.Lock()
		seen[key] = rec // …then write.
		mu.Unlock()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
	srv := httptest.NewServer(o.mux(post))
	t.Cleanup(srv.Close)
	return srv, o
}

// protectedServer is the same API behind idemhttp over idemmem.
func protectedServer(t testing.TB) (*httptest.Server, *orders) {
	t.Helper()
	o := &orders{}
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(o.mux(m.Handler(http.HandlerFunc(o.create))))
	t.Cleanup(srv.Close)
	return srv, o
}
