// Package obsload is a known workload for the observability tests: fresh
// keys, replays, concurrent duplicates released by one barrier, and a key
// reused with another body. It says exactly what happened, for a test to
// compare with what a tracer counted. It imports nothing but the standard
// library, so that every module's tests may use it.
package obsload

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// Route is the pattern the workload's requests are served under.
const Route = "/orders"

// Body is what App answers to every execution: its length is what the
// store keeps per completed key.
const Body = `{"id":"ord_1","total_cents":1900}`

// Workload is what Run sends.
type Workload struct {
	// Fresh keys, each sent once and executed.
	Fresh int
	// Replays of the fresh keys, sequential, each answered from the store.
	Replays int
	// Duplicates send one key from that many goroutines released at the
	// same instant: one executes, and its handler holds until every
	// other has been answered 409, so that none of them can be a replay.
	Duplicates int
	// Prefix makes the keys unique to one run.
	Prefix string

	once    sync.Once
	held    chan struct{} // closed to let the duplicate's execution finish
	release func()
}

// Counts is what happened, by idemhttp outcome.
type Counts struct {
	Executed, Replayed, InFlight, FingerprintMismatch int
	// Claims is how many claims reached the store; Completions how many
	// completions.
	Claims, Completions int
}

// App is the handler to protect (mount it under "POST /orders" behind the
// middleware): it answers 201 and Body, and holds the duplicate key's
// execution until the other duplicates have been answered.
func (w *Workload) App() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get(idemhttp.HeaderKey) == w.dupKey() {
			<-w.hold()
		}
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusCreated)
		_, _ = rw.Write([]byte(Body))
	})
}

// hold returns the channel the duplicate's execution waits on.
func (w *Workload) hold() chan struct{} {
	w.once.Do(func() {
		w.held = make(chan struct{})
		var closing sync.Once
		w.release = func() { closing.Do(func() { close(w.held) }) }
	})
	return w.held
}

func (w *Workload) dupKey() string { return w.Prefix + "-dup" }

// Sender sends one POST /orders with key and body, and returns its status
// and whether it was a replay.
type Sender func(key, body string) (status int, replayed bool)

// InProcess returns a Sender that serves each request with h in process.
func InProcess(h http.Handler) Sender {
	return func(key, body string) (int, bool) {
		r := httptest.NewRequest(http.MethodPost, Route, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idemhttp.HeaderKey, key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code, rec.Header().Get(idemhttp.HeaderReplayed) == "true"
	}
}

// Run sends the workload through send, checks every answer, and returns
// what happened. The answers are checked as they come, so a count that
// does not match a tracer's is the tracer's error.
func (w *Workload) Run(t testing.TB, send Sender) Counts {
	t.Helper()
	var c Counts
	body := func(i int) string { return `{"cart_id":"c_` + strconv.Itoa(i) + `","total_cents":1900}` }
	key := func(i int) string { return w.Prefix + "-" + strconv.Itoa(i) }
	for i := range w.Fresh {
		if status, replayed := send(key(i), body(i)); status != http.StatusCreated || replayed {
			t.Fatalf("fresh key %d: status %d replayed %v, want 201 fresh", i, status, replayed)
		}
		c.Executed++
		c.Claims++
		c.Completions++
	}
	for i := range w.Replays {
		k := i % max(w.Fresh, 1)
		if status, replayed := send(key(k), body(k)); status != http.StatusCreated || !replayed {
			t.Fatalf("replay %d: status %d replayed %v, want a 201 replay", i, status, replayed)
		}
		c.Replayed++
		c.Claims++
	}
	if w.Duplicates > 0 {
		c = w.duplicates(t, send, c)
	}
	if w.Fresh > 0 {
		if status, _ := send(key(0), body(0)+" "); status != http.StatusUnprocessableEntity {
			t.Fatalf("key reused with another body: status %d, want 422", status)
		}
		c.FingerprintMismatch++
		c.Claims++
	}
	return c
}

// duplicates sends the duplicate key from w.Duplicates goroutines at once.
func (w *Workload) duplicates(t testing.TB, send Sender, c Counts) Counts {
	t.Helper()
	var (
		ready, done sync.WaitGroup
		start       = make(chan struct{})
		conflicts   atomic.Int64
		created     atomic.Int64
		others      = int64(w.Duplicates - 1)
		answered    atomic.Int64
		unexpected  = make(chan string, w.Duplicates)
	)
	w.hold()
	if others == 0 {
		w.release()
	}
	// Should the store let two duplicates execute, neither would ever be
	// released: the test fails then instead of hanging.
	stuck := time.AfterFunc(time.Minute, func() {
		select {
		case unexpected <- "nothing within a minute (more than one execution holding?)":
		default:
		}
		w.release()
	})
	for range w.Duplicates {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			status, replayed := send(w.dupKey(), `{"cart_id":"dup","total_cents":1900}`)
			if status == http.StatusCreated && !replayed {
				created.Add(1)
				return
			}
			if status == http.StatusConflict {
				conflicts.Add(1)
			} else {
				unexpected <- "status " + strconv.Itoa(status) + " replayed " + strconv.FormatBool(replayed)
			}
			if answered.Add(1) == others {
				w.release()
			}
		}()
	}
	ready.Wait()
	close(start) // the barrier: every duplicate leaves at once
	done.Wait()
	stuck.Stop()
	select {
	case u := <-unexpected:
		t.Fatalf("duplicate answered %s, want one 201 and 409s", u)
	default:
	}
	if created.Load() != 1 || conflicts.Load() != others {
		t.Fatalf("duplicates: %d executed and %d conflicts, want 1 and %d", created.Load(), conflicts.Load(), others)
	}
	c.Executed++
	c.Completions++
	c.InFlight += int(others)
	c.Claims += w.Duplicates
	return c
}
